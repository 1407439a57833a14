// sampling.cu: per-row GPU sampler with exactly the contract of docs/ops.md "sample", mirroring
// the CPU kernel's arithmetic (e_j = exp(l_j / T - l_max / T) of an fp32 argument, rounded to
// fp32; fp64 sums; min_p as e_j >= min_p; walks in descending-e order, ties to the lower id).
//
// sample_kernel: one block of 1024 threads per row; several passes over the row's V logits
// (L2-resident), no full sort:
//   1. raw max and log-sum-exp (fp64) -> logprob of the drawn token; top-T raw alternatives by
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
#include "common.cuh"

#define S_THREADS 1024
#define S_CAP 2048
#define S_FX_SCALE 17592186044416.0  // 2^44: fixed-point scale of e in [0, 1]
typedef unsigned long long u64;

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
};
static_assert(sizeof(SampleParams) == 176, "SampleParams layout is mirrored in sampling.py");

__device__ __forceinline__ double uniform01(u64 seed, i64 n) {
  u64 z = seed + ((u64)n + 1ull) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

// Order-preserving key: a > b as floats <=> key(a) > key(b) as unsigned.
__device__ __forceinline__ unsigned fkey(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ u64 to_fx(float e) { return (u64)((double)e * S_FX_SCALE); }

// The value stream a selection walks: raw logits (mode 0) or e_j of the penalised row (mode 1).
struct Stream {
  const float* x;
  int mode;
  float temp, top;  // mode 1: e_j = exp(x_j / temp - top), as the CPU computes it
  __device__ __forceinline__ float value(int j) const {
    // fp32 argument as on the CPU; exp in fp64 rounded to fp32 (nearly always the correctly
    // rounded fp32 value, so both backends agree on e_j far more often than with expf's 2 ulp)
    return mode == 0 ? x[j] : (float)exp((double)(x[j] / temp - top));
  }
};

struct SampleShared {
  int hist_cnt[256];
  u64 hist_mass[256];
  unsigned cand_key[S_CAP];
  int cand_id[S_CAP];
  int scan[S_THREADS / 32];
  double dred[S_THREADS / 32];
  int ired[S_THREADS / 32];
  unsigned sel_key;
  int sel_count_gt;
  u64 sel_mass_gt;
  int best_id;
  float best_val;
  int token;
  int fallback;
};

__device__ double block_sum_f64(double v, double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < S_THREADS / 32; ++w) t += red[w];
  return t;
}
__device__ int block_sum_i32(int v, int* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  int t = 0;
  for (int w = 0; w < S_THREADS / 32; ++w) t += red[w];
  return t;
}
// Exclusive prefix sum of one int per thread, in thread order.
__device__ int block_exclusive_scan(int v, int* scan) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) scan[warp] = incl;
  __syncthreads();
  int base = 0;
  for (int w = 0; w < warp; ++w) base += scan[w];
  return base + incl - v;
}

// Radix search over the keys of `st` (restricted to ids < vocab). Finds the key kappa of the
// element at sorted position `pos` (mode BY_COUNT) or of the first element whose inclusive
// cumulative fixed-point mass reaches `target` (>= target, or > target if strict; BY_MASS).
// Leaves in sh: sel_key, sel_count_gt (elements with a larger key) and, when by_mass or
// track_mass, sel_mass_gt (their fixed-point mass).
__device__ void radix_search(const Stream& st, int vocab, bool by_mass, long long pos,
                             u64 target, bool strict, bool track_mass, SampleShared& sh) {
  track_mass = track_mass || by_mass;
  unsigned prefix = 0, mask = 0;
  int count_gt = 0;
  u64 mass_gt = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += S_THREADS) {
      sh.hist_cnt[i] = 0;
      sh.hist_mass[i] = 0;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < vocab; j += S_THREADS) {
      const float v = st.value(j);
      const unsigned k = fkey(v);
      if ((k & mask) == prefix) {
        const int d = (k >> shift) & 255;
        atomicAdd(&sh.hist_cnt[d], 1);
        if (track_mass) atomicAdd(&sh.hist_mass[d], to_fx(v));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 255;
      for (; d > 0; --d) {
        if (by_mass) {
          const u64 reach = mass_gt + sh.hist_mass[d];
          if (strict ? reach > target : reach >= target) break;
        } else if (count_gt + sh.hist_cnt[d] > pos) {
          break;
        }
        count_gt += sh.hist_cnt[d];
        mass_gt += sh.hist_mass[d];
      }
      sh.sel_key = prefix | ((unsigned)d << shift);
      sh.sel_count_gt = count_gt;
      sh.sel_mass_gt = mass_gt;
    }
    __syncthreads();
    prefix = sh.sel_key;
    mask |= 255u << shift;
    count_gt = sh.sel_count_gt;
    mass_gt = sh.sel_mass_gt;
  }
}

// Ordered pass over contiguous id ranges per thread: writes into cand the elements with key >
// kappa and the first `need_eq` elements (by id) with key == kappa. Returns the count written.
__device__ int gather_top(const Stream& st, int vocab, unsigned kappa, int need_eq,
                          SampleShared& sh) {
  const int per = (vocab + S_THREADS - 1) / S_THREADS;
  const int j0 = min(vocab, (int)threadIdx.x * per), j1 = min(vocab, j0 + per);
  int gt = 0, eq = 0;
  for (int j = j0; j < j1; ++j) {
    const unsigned k = fkey(st.value(j));
    gt += k > kappa;
    eq += k == kappa;
  }
  const int total_gt = block_sum_i32(gt, sh.ired);
  const int gt_off = block_exclusive_scan(gt, sh.scan);
  const int eq_off = block_exclusive_scan(eq, sh.scan);
  int wg = gt_off, we = eq_off;
  for (int j = j0; j < j1; ++j) {
    const unsigned k = fkey(st.value(j));
    if (k > kappa) {
      sh.cand_key[wg] = k;
      sh.cand_id[wg] = j;
      ++wg;
    } else if (k == kappa) {
      if (we < need_eq) {
        sh.cand_key[total_gt + we] = k;
        sh.cand_id[total_gt + we] = j;
      }
      ++we;
    }
  }
  __syncthreads();
  return total_gt + min(need_eq, block_sum_i32(eq, sh.ired));
}

// Sort cand[0, n) by key descending, id ascending (bitonic over the next power of two).
__device__ void sort_candidates(int n, SampleShared& sh) {
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += S_THREADS) {
    sh.cand_key[i] = 0u;
    sh.cand_id[i] = 0x7fffffff;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += S_THREADS) {
        const int l = i ^ j;
        if (l > i) {
          const unsigned ki = sh.cand_key[i], kl = sh.cand_key[l];
          const int ii = sh.cand_id[i], il = sh.cand_id[l];
          const bool i_first = ki > kl || (ki == kl && ii < il);
          const bool ascending_block = (i & k) == 0;  // "first" elements go to the front
          if (ascending_block ? !i_first : i_first) {
            sh.cand_key[i] = kl; sh.cand_key[l] = ki;
            sh.cand_id[i] = il; sh.cand_id[l] = ii;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The k largest elements of the stream, sorted (k <= S_CAP); returns how many (min(k, vocab)).
__device__ int select_top(const Stream& st, int vocab, int k, SampleShared& sh) {
  k = min(k, vocab);
  if (k <= 0) return 0;
  radix_search(st, vocab, false, k - 1, 0, false, false, sh);
  const unsigned kappa = sh.sel_key;
  const int need_eq = k - sh.sel_count_gt;
  __syncthreads();
  const int n = gather_top(st, vocab, kappa, need_eq, sh);
  sort_candidates(n, sh);
  return n;
}

// Id of the element at sorted position `pos` given its key kappa and count_gt: the
// (pos - count_gt)-th element with key == kappa in id order.
__device__ int element_at(const Stream& st, int vocab, unsigned kappa, int tie_index,
                          SampleShared& sh) {
  const int per = (vocab + S_THREADS - 1) / S_THREADS;
  const int j0 = min(vocab, (int)threadIdx.x * per), j1 = min(vocab, j0 + per);
  int eq = 0;
  for (int j = j0; j < j1; ++j) eq += fkey(st.value(j)) == kappa;
  const int off = block_exclusive_scan(eq, sh.scan);
  if (tie_index >= off && tie_index < off + eq) {
    int seen = off;
    for (int j = j0; j < j1; ++j) {
      if (fkey(st.value(j)) == kappa) {
        if (seen == tie_index) sh.token = j;
        ++seen;
      }
    }
  }
  __syncthreads();
  return sh.token;
}

__global__ void __launch_bounds__(S_THREADS) sample_kernel(const SampleParams p) {
  __shared__ SampleShared sh;
  __shared__ float fred[32];
  const int b = blockIdx.x;
  const int vocab = p.vocab;
  const float* row = p.logits + (i64)b * p.logits_rs;
  float* lg = p.scratch + (i64)b * p.scratch_rs;

  // 1. raw log-softmax statistics, copy to scratch
  float m = -NINFER_INF;
  for (int j = threadIdx.x; j < vocab; j += S_THREADS) m = fmaxf(m, row[j]);
  m = block_max(m, fred);
  double z = 0.0;
  for (int j = threadIdx.x; j < vocab; j += S_THREADS) {
    const float v = row[j];
    z += (double)expf(v - m);
    lg[j] = v;
  }
  z = block_sum_f64(z, sh.dred);
  const double lse = (double)m + log(z);
  if (p.n_top > 0) {
    Stream raw{row, 0, 1.0f, 0.0f};
    const int n = select_top(raw, vocab, p.n_top, sh);
    for (int i = threadIdx.x; i < p.n_top; i += S_THREADS) {
      const bool ok = i < n;
      p.top_ids_out[(i64)b * p.top_rs + i] = ok ? sh.cand_id[i] : -1;
      p.top_logprobs_out[(i64)b * p.top_rs + i] =
          ok ? (float)((double)key_value(sh.cand_key[i]) - lse) : -NINFER_INF;
    }
    __syncthreads();
  }
  // 2. penalties (unique token ids per row), then argmax (ties to the lower id)
  __syncthreads();
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
  const float temp = p.temperature[b];
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
    const int tok = sh.token;
    p.tokens_out[b] = tok;
    p.logprobs_out[b] = (float)((double)row[tok] - lse);
  }
}
