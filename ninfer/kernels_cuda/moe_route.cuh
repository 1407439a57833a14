// moe_route.cuh: one row's MoE routing on a warp (moe_route_row) and the grouping of the routed
// (token, slot) pairs by expert in one block (moe_group_block). Shared by moe.cu (the routing
// kernels, the fused gate_up) and linear.cu (linear_tma_swiglu_route_kernel, whose last block
// routes while the others run a SwiGLU GEMV).
#pragma once
#include "common.cuh"

#define MOE_GROUP 8  // group_pairs row stride (max NT)

// One row's routing on one warp; lane holds experts e = 32 j + lane (j < J, 32 J >= E).
// Arithmetic (fixed, whatever the launch shape): m = max of the logits; p_e = expf(l_e - m) /
// total, where total adds, for j = 0, 1, ... in order starting from 0, the warp butterfly sum
// (common.cuh warp_sum) of the lanes' values of j (0 for e >= E); then K picks of the largest p
// (ties: lower id; a total order on finite p, so the reduction order cannot change a pick) and
// w_k = p_k / (the picked p summed in pick order). These are the sums of the former kernel with
// one thread per expert in a block of 32 ceil(E / 32) threads (block_sum), so its results are
// kept bitwise. A row whose p are NaN (a NaN or +inf logit, or all -inf) picks experts 0..K-1
// with NaN weights, like the CPU kernel (the former kernel repeated expert 0, which
// moe_combine_kernel cannot take). Writes w[k], ids[k] (k < K) and, when s_ids is not null,
// s_ids[k] = ids[k].
template <int J>
__device__ __forceinline__ void moe_route_row(const float* __restrict__ l, int experts,
                                              int top_k, int lane, float* __restrict__ w,
                                              int* __restrict__ ids, int* s_ids) {
  const int used = (experts + 31) >> 5;  // j < used hold experts (the former kernel's warps)
  float p[J];
  float m = -NINFER_INF;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    p[j] = 32 * j + lane < experts ? l[32 * j + lane] : -NINFER_INF;
    m = fmaxf(m, p[j]);
  }
  m = warp_max(m);
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    p[j] = 32 * j + lane < experts ? expf(p[j] - m) : 0.0f;
    if (j < used) total += warp_sum(p[j]);
  }
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const float q = p[j] / total;
    p[j] = 32 * j + lane < experts ? (q == q ? q : 0.0f) : -1.0f;  // -1: never picked
  }
  float sum = 0.0f, p0 = 0.0f, p1 = 0.0f;  // the picks k = lane (p0, id0) and k = lane + 32
  int id0 = 0, id1 = 0;
  for (int k = 0; k < top_k; ++k) {
    float bv = p[0];
    int bi = lane;
#pragma unroll
    for (int j = 1; j < J; ++j)
      if (p[j] > bv) { bv = p[j]; bi = 32 * j + lane; }  // ids rise with j: ties keep the lower
    // the warp's largest value, ties to the lowest id, in two warp reductions: p is in [0, 1]
    // or -1 (taken / never picked), so key = bits + 1 (0 for -1) orders like the values
    const unsigned key = bv >= 0.0f ? __float_as_uint(bv) + 1u : 0u;
    const unsigned best = __reduce_max_sync(0xffffffffu, key);
    bi = (int)__reduce_min_sync(0xffffffffu, key == best ? (unsigned)bi : 0xffffffffu);
    bv = best == 0u ? -1.0f : __uint_as_float(best - 1u);
    sum += bv;
    if (k == lane) { p0 = bv; id0 = bi; }
    if (k == lane + 32) { p1 = bv; id1 = bi; }
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (32 * j + lane == bi) p[j] = -1.0f;  // taken
  }
  if (lane < top_k) {
    w[lane] = p0 / sum;
    ids[lane] = id0;
    if (s_ids) s_ids[lane] = id0;
  }
  if (lane + 32 < top_k) {
    w[lane + 32] = p1 / sum;
    ids[lane + 32] = id1;
    if (s_ids) s_ids[lane + 32] = id1;
  }
}

template <bool NAMED>
__device__ __forceinline__ void moe_group_sync(int threads) {
  if constexpr (NAMED)
    asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
  else
    __syncthreads();
}

// The group tables of the pairs p < n_pairs (ids[p]: pair p's expert): pairs sorted by (expert,
// pair), each expert's run cut into groups of <= chunk (<= MOE_GROUP) pairs. NAMED = false: every
// thread of the block calls, blockDim.x a multiple of 32 in [n_pairs, 1024], synchronised by
// __syncthreads. NAMED: threads 0..threads-1 call (a multiple of 32 in [n_pairs, 1024]),
// synchronised by named barrier 1 (the others may have exited).
template <bool NAMED = false>
__device__ __forceinline__ void moe_group_block(const int* __restrict__ ids, int n_pairs,
                                                int chunk, int* __restrict__ group_expert,
                                                int* __restrict__ group_pairs,
                                                int* __restrict__ num_groups, int threads = 0) {
  __shared__ int sorted[1024];
  __shared__ int scan[32];
  const int t = threadIdx.x;
  if constexpr (NAMED) {
    for (int i = t; i < n_pairs * MOE_GROUP; i += threads) group_pairs[i] = -1;
  } else {
    for (int i = t; i < n_pairs * MOE_GROUP; i += blockDim.x) group_pairs[i] = -1;
  }
  if (t < n_pairs) {
    const int e = ids[t];
    int rank = 0;
    for (int q = 0; q < n_pairs; ++q) {
      const int eq = ids[q];
      rank += eq < e || (eq == e && q < t);
    }
    sorted[rank] = t;
  }
  moe_group_sync<NAMED>(threads);
  // position i of the sorted order: a group starts where a run starts or every `chunk` pairs
  int boundary = 0, p = -1, pe = 0, pr = 0;
  if (t < n_pairs) {
    p = sorted[t];
    pe = ids[p];
    pr = 0;
    for (int q = 0; q < p; ++q) pr += ids[q] == pe;
    boundary = pr % chunk == 0;
  }
  // exclusive scan of boundaries over positions (thread order = sorted order)
  const int lane = t & 31, warp = t >> 5;
  int incl = boundary;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) scan[warp] = incl;
  moe_group_sync<NAMED>(threads);
  int base = 0;
  for (int w = 0; w < warp; ++w) base += scan[w];
  const int gid = base + incl - 1;  // group of this position (inclusive count - 1)
  if (t < n_pairs) {
    group_pairs[gid * MOE_GROUP + pr % chunk] = p;
    if (boundary) group_expert[gid] = pe;
  }
  if constexpr (NAMED) {
    if (t == threads - 1) *num_groups = base + incl;
  } else {
    if (t == blockDim.x - 1) *num_groups = base + incl;
  }
}
