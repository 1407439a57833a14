// sampling.cu: per-row GPU sampler with exactly the contract of docs/ops.md "sample", mirroring
// the CPU kernel's arithmetic (e_j = exp(l_j / T - l_max / T) of an fp32 argument, rounded to
// fp32; fp64 sums; min_p as e_j >= min_p; walks in descending-e order, ties to the lower id).
//
// sample_stats_kernel: grid (NB, B), 256 threads: block i takes the i-th of NB equal slices of
//   the row and writes its max, its argmax (ties to the lower id) and z_i = sum_j exp(l_j - m_i)
//   (expf of the fp32 difference, fp64 sum) into the first 4 * NB words of the row's scratch.
//   Spreading these two passes over many SMs is what keeps greedy sampling cheap.
// sample_kernel: one block of 1024 threads per row; several passes over the row's V logits
// (L2-resident), no full sort:
//   (the top-T alternatives are skipped when the optional device count `top_count` is 0: the
//   decode graph is captured with T = 20 columns and most steps want none)
//   1. max m = max_i m_i and log-sum-exp: z = sum_i z_i exp(m_i - m) in slice order (fp64) ->
//      logprob of the drawn token. Greedy rows without (effective) penalties stop here (token = the first
//      slice argmax reaching m). Otherwise: top-T raw alternatives by
//      radix select (4 passes of 8-bit digits over order-preserving uint32 keys, integer
//      histograms in shared memory, so deterministic) + ordered compaction + bitonic sort;
//   2. penalised logits into the caller's scratch row; argmax (greedy rows stop here);
//   3. e_j (written over the scratch row), total (fp64), n_min; keep0 = min(n_min, top_k);
//      the top min(keep0, CAP) candidates are selected and sorted as in 1, then one thread
//      walks them in fp64 exactly like the CPU (top_p cut, kept mass, draw u * kept mass);
//   4. fallback when the kept prefix may be longer than CAP (top_k off and the first CAP
//      candidates hold less than top_p of the mass, i.e. a flat distribution): the same walks
//      done by mass-radix searches with 2^-44 fixed-point masses (integer atomics: deterministic).
// uniform(seed, n) is the splitmix64 finaliser of docs/ops.md, in uint64 arithmetic.
// Both kernels are launched with programmatic dependent launch (sampling.py): `pdl_enter` is
// the first statement.
#include "select.cuh"

#define SAMPLE_MAX_SLICES 64  // sampling.py MAX_SLICES

struct SampleParams {
  const float* logits;
  float* scratch;  // [B, V] penalised logits
  const float* temperature;
  const int* top_k;
  const float* top_p;
  const float* min_p;
  const float* rep;
  const float* presence;
  const float* frequency;
  const u64* seeds;
  const i64* counters;
  const int* pen_offsets;
  const int* pen_tokens;
  const int* pen_counts;
  int* tokens_out;
  float* logprobs_out;
  int* top_ids_out;
  float* top_logprobs_out;
  i64 logits_rs, scratch_rs, top_rs;
  int vocab, n_top;
  int n_slices;
  int pad;
  const int* top_count;  // optional device int: alternatives wanted this call (<= n_top)
};
static_assert(sizeof(SampleParams) == 192, "SampleParams layout is mirrored in sampling.py");

__device__ __forceinline__ double uniform01(u64 seed, i64 n) {
  u64 z = seed + ((u64)n + 1ull) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

// Slice partials in the first 4 * n_slices words of the row's scratch: max, argmax, z (fp64 as
// two words). sample_kernel reads them before anything rewrites the scratch row.
__device__ __forceinline__ void slice_range(int vocab, int n_slices, int i, int& begin, int& end) {
  const int per = (vocab + n_slices - 1) / n_slices;
  begin = min(vocab, i * per);
  end = min(vocab, begin + per);
}

__global__ void __launch_bounds__(256) sample_stats_kernel(const SampleParams p) {
  pdl_enter();
  __shared__ float fred[32];
  __shared__ int ired[32];
  __shared__ double dred[32];
  const int b = blockIdx.y;
  const float* row = p.logits + (i64)b * p.logits_rs;
  int begin, end;
  slice_range(p.vocab, p.n_slices, blockIdx.x, begin, end);
  float m = -NINFER_INF;
  int arg = 0x7fffffff;
  for (int j = begin + threadIdx.x; j < end; j += 256) {
    const float v = row[j];
    if (v > m || arg == 0x7fffffff) { m = v; arg = j; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, m, o);
    const int oi = __shfl_xor_sync(0xffffffffu, arg, o);
    if (ov > m || (ov == m && oi < arg)) { m = ov; arg = oi; }
  }
  if (lane == 0) { fred[warp] = m; ired[warp] = arg; }
  __syncthreads();
  m = fred[0];
  arg = ired[0];
  for (int w = 1; w < 8; ++w)
    if (fred[w] > m || (fred[w] == m && ired[w] < arg)) { m = fred[w]; arg = ired[w]; }
  double z = 0.0;
  for (int j = begin + threadIdx.x; j < end; j += 256) z += (double)expf(row[j] - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
  __syncthreads();
  if (lane == 0) dred[warp] = z;
  __syncthreads();
  if (threadIdx.x == 0) {
    z = 0.0;
    for (int w = 0; w < 8; ++w) z += dred[w];
    unsigned* part = reinterpret_cast<unsigned*>(p.scratch + (i64)b * p.scratch_rs);
    const int i = blockIdx.x, ns = p.n_slices;
    const unsigned long long zb = (unsigned long long)__double_as_longlong(z);
    part[i] = __float_as_uint(m);
    part[ns + i] = (unsigned)arg;
    part[2 * ns + 2 * i] = (unsigned)(zb & 0xffffffffull);
    part[2 * ns + 2 * i + 1] = (unsigned)(zb >> 32);
  }
}

__global__ void __launch_bounds__(S_THREADS) sample_kernel(const SampleParams p) {
  pdl_enter();
  __shared__ SampleShared sh;
  const int b = blockIdx.x;
  const int vocab = p.vocab;
  const float* row = p.logits + (i64)b * p.logits_rs;
  float* lg = p.scratch + (i64)b * p.scratch_rs;

  // 1. raw log-softmax statistics from the slice partials (slice order). The partials are
  // staged in shared memory by all threads and the slices' exp terms computed one per thread;
  // thread 0 then folds them in slice order with the same fma as a serial loop would (so the
  // same bits), instead of a chain of 2 x ns global round trips and fp64 exps.
  __shared__ double sh_lse;
  __shared__ int sh_argmax;
  __shared__ float sh_m;
  __shared__ unsigned sh_part[4 * SAMPLE_MAX_SLICES];
  __shared__ double sh_exp[SAMPLE_MAX_SLICES];
  const int ns = p.n_slices;  // <= SAMPLE_MAX_SLICES (sampling.py n_slices)
  {
    const unsigned* part = reinterpret_cast<const unsigned*>(lg);
    for (int i = threadIdx.x; i < 4 * ns; i += S_THREADS) sh_part[i] = part[i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -NINFER_INF;
    int arg = 0x7fffffff;
    for (int i = 0; i < ns; ++i) {
      const float mi = __uint_as_float(sh_part[i]);
      if (mi > m || arg == 0x7fffffff) { m = mi; arg = (int)sh_part[ns + i]; }
    }
    sh_m = m;
    sh_argmax = arg;
  }
  __syncthreads();
  if (threadIdx.x < ns)
    sh_exp[threadIdx.x] = exp((double)__uint_as_float(sh_part[threadIdx.x]) - (double)sh_m);
  __syncthreads();
  if (threadIdx.x == 0) {
    double z = 0.0;
    for (int i = 0; i < ns; ++i) {
      const unsigned long long zb = (unsigned long long)sh_part[2 * ns + 2 * i] |
                                    ((unsigned long long)sh_part[2 * ns + 2 * i + 1] << 32);
      if (__uint_as_float(sh_part[i]) > -NINFER_INF)
        z = __fma_rn(sh_exp[i], __longlong_as_double((long long)zb), z);
    }
    sh_lse = (double)sh_m + log(z);
  }
  __syncthreads();
  const double lse = sh_lse;
  const float temp = p.temperature[b];
  const bool no_penalty = p.pen_offsets[b + 1] == p.pen_offsets[b] ||
                          (p.rep[b] == 1.0f && p.presence[b] == 0.0f && p.frequency[b] == 0.0f);
  const bool fast = temp == 0.0f && no_penalty;  // greedy on the raw logits
  if (!fast) {
    for (int j = threadIdx.x; j < vocab; j += S_THREADS) lg[j] = row[j];
  }
  const int n_top = p.top_count ? max(0, min(p.n_top, *p.top_count)) : p.n_top;
  for (int i = n_top + threadIdx.x; i < p.n_top; i += S_THREADS) {  // not wanted this call
    p.top_ids_out[(i64)b * p.top_rs + i] = -1;
    p.top_logprobs_out[(i64)b * p.top_rs + i] = -NINFER_INF;
  }
  if (n_top > 0) {
    Stream raw{row, 0, 1.0f, 0.0f};
    const int n = select_top(raw, vocab, n_top, sh);
    for (int i = threadIdx.x; i < n_top; i += S_THREADS) {
      const bool ok = i < n;
      p.top_ids_out[(i64)b * p.top_rs + i] = ok ? sh.cand_id[i] : -1;
      p.top_logprobs_out[(i64)b * p.top_rs + i] =
          ok ? (float)((double)key_value(sh.cand_key[i]) - lse) : -NINFER_INF;
    }
    __syncthreads();
  }
  // 2. penalties (unique token ids per row), then argmax (ties to the lower id)
  __syncthreads();
  if (!fast) {
    const float r = p.rep[b];
    for (int i = p.pen_offsets[b] + threadIdx.x; i < p.pen_offsets[b + 1]; i += S_THREADS) {
      const int tok = p.pen_tokens[i];
      const int cnt = p.pen_counts[i];
      if (tok < 0 || tok >= vocab) continue;
      float v = row[tok];
      v = v > 0.0f ? v / r : v * r;
      v -= p.frequency[b] * (float)cnt + (cnt > 0 ? p.presence[b] : 0.0f);
      lg[tok] = v;
    }
    __syncthreads();
    {
      float bv = -NINFER_INF;
      int bi = 0x7fffffff;
      for (int j = threadIdx.x; j < vocab; j += S_THREADS) {
        const float v = lg[j];
        if (v > bv || bi == 0x7fffffff) { bv = v; bi = j; }
      }
      // block argmax: larger value, then lower id
      const int lane = threadIdx.x & 31;
  #pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
      }
      __syncthreads();
      if (lane == 0) {
        sh.cand_key[threadIdx.x >> 5] = __float_as_uint(bv);
        sh.cand_id[threadIdx.x >> 5] = bi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        float best = __uint_as_float(sh.cand_key[0]);
        int id = sh.cand_id[0];
        for (int w = 1; w < S_THREADS / 32; ++w) {
          const float v = __uint_as_float(sh.cand_key[w]);
          if (v > best || (v == best && sh.cand_id[w] < id)) { best = v; id = sh.cand_id[w]; }
        }
        sh.best_id = id;
        sh.best_val = best;
        sh.token = id;
      }
      __syncthreads();
    }
  }
  if (temp != 0.0f) {
    // 3. filters and draw
    const float top = sh.best_val / temp;
    const Stream from_logits{lg, 1, temp, top};
    const float min_p = p.min_p[b];
    double total = 0.0;
    u64 total_fx = 0;
    int n_min = 0;
    for (int j = threadIdx.x; j < vocab; j += S_THREADS) {
      const float e = from_logits.value(j);
      lg[j] = e;  // the scratch row now holds e_j: later passes read it, no exp again
      total += (double)e;
      total_fx += to_fx(e);
      n_min += e >= min_p;
    }
    const Stream es{lg, 0, 1.0f, 0.0f};
    total = block_sum_f64(total, sh.dred);
    n_min = block_sum_i32(n_min, sh.ired);
    {  // total_fx: exact integer sum (order-free)
      __shared__ u64 fx_acc;
      if (threadIdx.x == 0) fx_acc = 0;
      __syncthreads();
      atomicAdd(&fx_acc, total_fx);
      __syncthreads();
      total_fx = fx_acc;
      __syncthreads();
    }
    int keep = n_min;
    const int tk = p.top_k[b];
    if (tk > 0 && tk < keep) keep = tk;
    const bool check_p = p.top_p[b] < 1.0f;
    const double u = uniform01(p.seeds[b], p.counters[b]);
    if (!check_p && keep >= vocab) {
      // whole distribution: draw by mass search over everything
      const u64 target = (u64)(u * (double)total_fx);
      radix_search(es, vocab, true, 0, target, true, true, sh);
      const unsigned kappa = sh.sel_key;
      const u64 e_fx = to_fx(key_value(kappa));
      const u64 j = e_fx ? (target - sh.sel_mass_gt) / e_fx : 0;  // ties before the crossing one
      const int pos = min((long long)vocab - 1, (long long)sh.sel_count_gt + (long long)j);
      __syncthreads();
      element_at(es, vocab, kappa, pos - sh.sel_count_gt, sh);
    } else {
      const int n = select_top(es, vocab, min(keep, S_CAP), sh);
      if (threadIdx.x == 0) {
        const double target = (double)p.top_p[b] * total;
        double cum = 0.0;
        int kept = min(keep, n);
        bool reached = false;
        for (int i = 0; i < kept; ++i) {
          cum += (double)key_value(sh.cand_key[i]);
          if (check_p && cum >= target) { kept = i + 1; reached = true; break; }
        }
        sh.fallback = !reached && keep > n;
        if (!sh.fallback) {
          const double uu = u * cum;
          double c2 = 0.0;
          int tok = sh.cand_id[kept - 1];
          for (int i = 0; i < kept; ++i) {
            c2 += (double)key_value(sh.cand_key[i]);
            if (c2 > uu) { tok = sh.cand_id[i]; break; }
          }
          sh.token = tok;
        }
      }
      __syncthreads();
      if (sh.fallback) {
        // 4. flat distribution: the top_p prefix and the draw by fixed-point mass searches
        long long keep_len = keep;
        u64 kept_fx = 0;
        bool have_mass = false;
        if (check_p) {
          const u64 target = (u64)((double)p.top_p[b] * (double)total_fx);
          radix_search(es, vocab, true, 0, target, false, true, sh);
          const u64 e_fx = to_fx(key_value(sh.sel_key));
          const u64 need = target > sh.sel_mass_gt ? target - sh.sel_mass_gt : 0;
          u64 j = e_fx ? (need + e_fx - 1) / e_fx : 1;  // ties up to the crossing one
          if (j == 0) j = 1;
          const long long len_p = (long long)sh.sel_count_gt + (long long)j;
          if (len_p <= keep_len) {
            keep_len = len_p;
            kept_fx = sh.sel_mass_gt + j * e_fx;
            have_mass = true;
          }
          __syncthreads();
        }
        if (!have_mass) {  // count limit: mass of the first `keep` elements
          radix_search(es, vocab, false, keep - 1, 0, false, true, sh);
          kept_fx = sh.sel_mass_gt + (u64)(keep - sh.sel_count_gt) * to_fx(key_value(sh.sel_key));
          __syncthreads();
        }
        const u64 target = (u64)(u * (double)kept_fx);
        radix_search(es, vocab, true, 0, target, true, true, sh);
        const u64 e_fx = to_fx(key_value(sh.sel_key));
        const u64 j = e_fx ? (target - sh.sel_mass_gt) / e_fx : 0;
        long long pos = (long long)sh.sel_count_gt + (long long)j;
        __syncthreads();
        if (pos >= keep_len) {  // rounding left none: the last kept element
          radix_search(es, vocab, false, keep_len - 1, 0, false, false, sh);
          pos = keep_len - 1;
        }
        const unsigned kap = sh.sel_key;
        const int cgt = sh.sel_count_gt;
        __syncthreads();
        element_at(es, vocab, kap, (int)(pos - cgt), sh);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int tok = fast ? sh_argmax : sh.token;
    p.tokens_out[b] = tok;
    p.logprobs_out[b] = (float)((double)row[tok] - lse);
  }
}
