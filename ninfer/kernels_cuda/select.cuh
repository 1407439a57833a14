// select.cuh: block-wide selection over a stream of V floats for the sampler (sampling.cu).
//
// One block of S_THREADS threads walks a row several times; nothing is sorted in full:
// - radix_search: 4 passes of 8-bit digits over order-preserving uint32 keys find the key of
//   the element at a sorted position (by count) or where an inclusive cumulative mass crosses a
//   target (by mass, 2^-44 fixed-point masses). Histograms use integer shared-memory atomics,
//   so results do not depend on thread timing.
// - gather_top / sort_candidates / select_top: the k (<= S_CAP) largest, in order (key
//   descending, id ascending) via ordered compaction over contiguous id ranges + bitonic sort.
// - element_at: the id of the i-th element (id order) with a given key.
#pragma once
#include "common.cuh"

#define S_THREADS 1024
#define S_CAP 2048
#define S_FX_SCALE 17592186044416.0  // 2^44: fixed-point scale of e in [0, 1]
typedef unsigned long long u64;

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

// Block-wide sum (every thread gets the total), fixed order: lanes, then warps in order.
template <typename T>
__device__ T block_sum_t(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  T t = 0;
  for (int w = 0; w < S_THREADS / 32; ++w) t += red[w];
  return t;
}
__device__ double block_sum_f64(double v, double* red) { return block_sum_t<double>(v, red); }
__device__ int block_sum_i32(int v, int* red) { return block_sum_t<int>(v, red); }
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
