// moe.cu: MoE routing and routed experts.
//
// moe_route_kernel<J>: one warp per token (lane: experts lane + 32 j, j < J): fp32 softmax over
//   all E experts, then K rounds of warp argmax (larger p, then lower id), weights renormalised
//   by their fp32 sum in pick order (moe_route_row).
//   moe_route_group_kernel<J>: the routing of all N tokens and moe_group_kernel's grouping in
//   one block (decode: one launch instead of two).
// Decode / capturable path (reads only the selected experts' weights, each once per call):
//   moe_group_kernel: one block; sorts the N*K (token, slot) pairs by (expert, pair) and cuts
//     each expert's run into groups of <= NT pairs (group_expert[g], group_pairs[g][8], -1
//     padded, num_groups). Grids below are sized for the worst case (N*K groups); blocks past
//     num_groups exit.
//   moe_gemv_kernel<WT, NT, R, ALIGNED, SWIGLU>: the GEMV core of gemv.cuh on expert e's
//     weights for the group's activation rows. SWIGLU=1 (gate_up): each block reduces rows
//     m0..m0+R of the gate half and the same rows of the up half and writes
//     act[pair] = silu(g) * u. SWIGLU=0 (down): y[pair] = down[e] @ act[pair]. The split of K
//     and the per-element order are those of linear.cu (batch invariant).
//   moe_mma_kernel<SWIGLU> (bf16 weights, 16-byte aligned rows): the same contract on tensor
//     cores (mma_gemv.cuh), groups of up to 8 pairs as the mma's 8 columns. SWIGLU=1: a warp's
//     16-row A tile is gate rows m0..m0+7 over up rows m0..m0+7, so each lane holds the gate and
//     the up value of the same (row, pair) after the split sum. Splits of K as in linear.cu.
//   moe_mma_rows_kernel<SWIGLU, XB> (the default; NINFER_GEMV_ROWS=0 selects moe_mma_kernel):
//     moe_mma_kernel with the weight tile read row-contiguously and staged through shared
//     memory (linear.cu linear_mma_rows_kernel); bitwise the same results.
//   moe_combine_kernel: out[n] = sum over k in ascending expert id of w[n,k] * y[row(n,k)],
//     optionally + sigmoid(gate[n]) * shared[n] (the gated shared expert).
//   moe_tma_gate_up_kernel (moe.py MOE_TMA, NINFER_MOE_TMA; sm_90, K % 16 == 0): the gate_up
//     stage of moe_mma_rows_kernel<1> with the weights streamed by bulk copies into a
//     shared-memory ring by a producer warp (persistent blocks walk the (group, 8-row tile)
//     items); the same K split, A fragments, x values, mma order and reduction order, so act is
//     bitwise the rows kernel's (see the kernel).
//   Fused decode path (moe.py FUSED, NINFER_MOE_FUSED; N <= 8, N*K <= 64, bf16 tensor-core
//   experts): moe_fused_gate_up_kernel<J> = moe_route_group_kernel<J> (recomputed by every
//   block into shared memory; block (0, 0) writes weights, ids and the group tables) +
//   moe_mma_rows_kernel<1>; moe_fused_down_kernel = moe_mma_rows_kernel<0> over every group of
//   a 16-column output tile + moe_combine_kernel for those columns (one block owns each output
//   element). Same functions and orders as the four launches: bitwise the same results.
//   moe_fused_down_kernel may also compute the gated shared expert's down projection (a team
//   of extra warps; bitwise linear_tma_kernel's result, moe.py shared_down_folds).
//   moe_tma_experts_kernel (moe.py PERSIST, NINFER_MOE_PERSIST, opt-in): the bulk-copy gate_up
//   stage, a grid barrier and the fused down stage in one persistent launch (see the kernel).
//   moe_tma_down_kernel (moe.py TMA_DOWN, NINFER_MOE_TMA_DOWN, opt-in): the fused down stage
//   after the bulk-copy gate_up with its weights copied and tables read before pdl_wait.
// bf16 activations (moe.py: a uint16 x, bf16_act): moe_tma_gate_up_kernel<XR, 1> reads x as bf16
//   bits (other gate_up stages read an exact f32 copy, moe_x_f32_kernel); the gate_up stages
//   store act as MoeGemvParams.out_mode says (moe_store_out), as bf16 bits for the rows-tile
//   down stages (moe_mma_rows_kernel<0, 1>, moe_fused_down_kernel<1>). A bf16 operand runs one
//   mma per k16 step (its lo term is 0): bitwise the f32 operand of the same values.
// Every kernel of the decode path (route, group, route_group, the expert stages, combine, the
// fused pair) may be launched with PDL (moe.py: pdl=True): they call pdl_wait before touching memory (pdl_enter).
// Prefill path (eager, cuBLAS strided-batched GEMMs on padded per-expert row blocks; moe.py):
//   moe_gather_kernel<OT>: x rows -> per-expert padded blocks (cast to the weights' type);
//   moe_swiglu_kernel<OT>: act = silu(g) * u over the padded blocks (cast to OT).
#include "bulk_copy.cuh"
#include "gemv.cuh"
#include "mma_gemv.cuh"
#include "moe_route.cuh"

#define MMA_U 4

// One warp per row, blockDim.x / 32 rows per block.
template <int J>
__global__ void __launch_bounds__(256) moe_route_kernel(const float* __restrict__ logits,
                                                        i64 logits_rs, int n_rows, int experts,
                                                        int top_k, float* __restrict__ w_out,
                                                        i64 w_rs, int* __restrict__ ids_out,
                                                        i64 ids_rs) {
  pdl_enter();
  const i64 n = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= n_rows) return;
  moe_route_row<J>(logits + n * logits_rs, experts, top_k, threadIdx.x & 31, w_out + n * w_rs,
                   ids_out + n * ids_rs, nullptr);
}

// ids: [N, K] contiguous; pairs p = n*K + k. chunk = NT (<= MOE_GROUP). n_pairs <= 1024.
__global__ void __launch_bounds__(1024) moe_group_kernel(const int* __restrict__ ids, int n_pairs,
                                                         int chunk, int* __restrict__ group_expert,
                                                         int* __restrict__ group_pairs,
                                                         int* __restrict__ num_groups) {
  pdl_enter();
  moe_group_block(ids, n_pairs, chunk, group_expert, group_pairs, num_groups);
}

// moe_route_kernel then moe_group_kernel in one block (warp w of W routes rows w, w + W, ...; the
// ids reach the grouping through shared memory). blockDim.x: a multiple of 32 in
// [n_rows * top_k, 1024].
template <int J>
__global__ void __launch_bounds__(1024) moe_route_group_kernel(
    const float* __restrict__ logits, i64 logits_rs, int n_rows, int experts, int top_k,
    float* __restrict__ w_out, i64 w_rs, int* __restrict__ ids_out, i64 ids_rs, int chunk,
    int* __restrict__ group_expert, int* __restrict__ group_pairs, int* __restrict__ num_groups) {
  __shared__ int s_ids[1024];
  pdl_enter();
  const int lane = threadIdx.x & 31;
  for (int n = threadIdx.x >> 5; n < n_rows; n += blockDim.x >> 5)
    moe_route_row<J>(logits + (i64)n * logits_rs, experts, top_k, lane, w_out + (i64)n * w_rs,
                     ids_out + (i64)n * ids_rs, s_ids + n * top_k);
  __syncthreads();
  moe_group_block(s_ids, n_rows * top_k, chunk, group_expert, group_pairs, num_groups);
}

struct MoeGemvParams {
  const void* w;            // [E, rows, K] expert weights
  const float* x;           // activation rows
  float* out;               // output rows (indexed by pair)
  const int* group_expert;
  const int* group_pairs;
  const int* num_groups;
  i64 w_es, w_rs, x_rs, out_rs;
  int m;          // output columns per pair (Im for gate_up, H for down)
  int k;          // reduction length
  int splits;
  int top_k;
  int up_offset;  // SWIGLU: row offset of the up half (Im)
  int x_by_pair;  // 1: x row = pair, 0: x row = pair / top_k
  int experts;    // an expert id outside [0, experts) yields NaN outputs
  int out_mode;   // how out is stored (moe_store_out): MOE_ACT_F32, _BF16_BITS, _BF16_F32
};
static_assert(sizeof(MoeGemvParams) == 112, "MoeGemvParams layout is mirrored in moe.py");

// How a stage stores out[pair][col] (moe.py ACT_*; a down stage's is always MOE_ACT_F32): the f32
// value; its bf16 rounding (nearest even) as bf16 bits (out then points at uint16 rows, out_rs
// elements apart: the down stages' rows tiles read them, XT = bf16raw); or that rounding's value
// as an f32 (for the down stages that read f32: bitwise the same down results, the lo terms
// being 0).
#define MOE_ACT_F32 0
#define MOE_ACT_BF16_BITS 1
#define MOE_ACT_BF16_F32 2
__device__ __forceinline__ void moe_store_out(const MoeGemvParams& p, i64 pair, int col,
                                              float v) {
  const i64 i = pair * p.out_rs + col;
  if (p.out_mode == MOE_ACT_BF16_BITS)
    reinterpret_cast<bf16raw*>(p.out)[i] = f32_to_bf16(v);
  else
    p.out[i] = p.out_mode == MOE_ACT_BF16_F32 ? to_f32(f32_to_bf16(v)) : v;
}

template <typename WT, int NT, int R, int ALIGNED, int SWIGLU>
__global__ void __launch_bounds__(256) moe_gemv_kernel(const MoeGemvParams p) {
  constexpr int RR = SWIGLU ? 2 * R : R;
  __shared__ float red[8 * RR * NT];
  pdl_enter();
  const int g = blockIdx.y;
  if (g >= *p.num_groups) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int e = p.group_expert[g];
  const bool bad = e < 0 || e >= p.experts;
  const int m0 = blockIdx.x * R;
  const int units = gemv_units(p.k);
  const int per = (units + p.splits - 1) / p.splits;
  const int u_begin = min(units, warp * per);
  const int u_end = min(units, u_begin + per);
  const WT* wexp = static_cast<const WT*>(p.w) + (i64)(bad ? 0 : e) * p.w_es;
  const WT* wrow[RR];
#pragma unroll
  for (int r = 0; r < RR; ++r) {
    const int row = r < R ? m0 + r : p.up_offset + m0 + (r - R);
    wrow[r] = (m0 + (r % R) < p.m && !bad) ? wexp + (i64)row * p.w_rs : nullptr;
  }
  const float* xrow[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int pr = p.group_pairs[g * MOE_GROUP + n];
    const int xr = p.x_by_pair ? pr : pr / p.top_k;
    xrow[n] = pr >= 0 ? p.x + (i64)xr * p.x_rs : nullptr;
  }
  float acc[RR][NT];
#pragma unroll
  for (int r = 0; r < RR; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[r][n] = 0.0f;
  gemv_warp_accumulate<WT, NT, RR, ALIGNED != 0>(wrow, xrow, p.k, u_begin, u_end, lane, acc);
  gemv_store_partials<RR, NT>(acc, red);
  for (int t = threadIdx.x; t < R * NT; t += blockDim.x) {
    const int r = t / NT, n = t % NT;
    const int pr = p.group_pairs[g * MOE_GROUP + n];
    if (m0 + r >= p.m || pr < 0) continue;
    float v = gemv_sum_splits<RR, NT>(red, p.splits, r, n);
    if (SWIGLU) v = silu_f(v) * gemv_sum_splits<RR, NT>(red, p.splits, R + r, n);
    if (bad) v = NINFER_NAN;
    moe_store_out(p, pr, m0 + r, v);
  }
}

// The block's outputs of the mma kernels (after the partials are in red): out[pair][m0 + r] =
// the split sum of (tile row r, pair slot n) (SWIGLU: silu(gate) * up), NaN for a bad expert;
// rows past M and empty slots are not stored. gp: the group's MOE_GROUP pair slots.
template <int SWIGLU>
__device__ __forceinline__ void moe_mma_store(const MoeGemvParams& p, const MmaPartials<8>& red,
                                              const int* gp, int m0, bool bad) {
  constexpr int TILE = SWIGLU ? 8 : 16;
  for (int idx = threadIdx.x; idx < TILE * 8; idx += blockDim.x) {
    const int r = idx >> 3, n = idx & 7;
    const int pn = gp[n];
    if (m0 + r >= p.m || pn < 0) continue;
    float v = mma_reduce_partials<SWIGLU>(red, p.splits, r, n);
    if (bad) v = NINFER_NAN;
    moe_store_out(p, pn, m0 + r, v);
  }
}

template <int SWIGLU>
__global__ void __launch_bounds__(256) moe_mma_kernel(const MoeGemvParams p) {
  __shared__ MmaPartials<8> red;  // [split][A row][pair in group]
  pdl_enter();
  const int grp = blockIdx.y;
  if (grp >= *p.num_groups) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int e = p.group_expert[grp];
  const bool bad = e < 0 || e >= p.experts;
  constexpr int TILE = SWIGLU ? 8 : 16;  // output rows per block
  const int m0 = blockIdx.x * TILE;
  int k_begin, k_end;
  mma_warp_k_range(p.k, p.splits, warp, k_begin, k_end);
  const bf16raw* wexp = static_cast<const bf16raw*>(p.w) + (i64)(bad ? 0 : e) * p.w_es;
  const int r0 = m0 + g, r1 = SWIGLU ? m0 + g : m0 + g + 8;  // output rows of A rows g, g+8
  const bf16raw* wrow0 = (r0 < p.m && !bad) ? wexp + (i64)r0 * p.w_rs : nullptr;
  const bf16raw* wrow1 =
      (r1 < p.m && !bad) ? wexp + (i64)(SWIGLU ? p.up_offset + r1 : r1) * p.w_rs : nullptr;
  const int pr = p.group_pairs[grp * MOE_GROUP + g];
  const float* xrow =
      pr >= 0 ? p.x + (i64)(p.x_by_pair ? pr : pr / p.top_k) * p.x_rs : nullptr;
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_gemv_accumulate<MMA_U>(wrow0, wrow1, xrow, k_begin, k_end, t, c);
  mma_store_partials(red, warp, g, t, c);
  __syncthreads();
  moe_mma_store<SWIGLU>(p, red, p.group_pairs + grp * MOE_GROUP, m0, bad);
}

// moe_mma_rows_kernel<SWIGLU>: moe_mma_kernel with the expert's weight tile read
// row-contiguously (mma_gemv.cuh, "Row-contiguous staging": a half-warp load reads 256
// contiguous bytes of one row instead of 64 bytes of each of 8 rows) and handed to the mmas
// through a 4 KiB per-warp shared buffer (stmatrix in, ldmatrix out), as linear_mma_rows_kernel
// does. Same grid, block, K split, A fragments, x values, mma order and reduction order as
// moe_mma_kernel, so the stored results are bitwise identical. One row tile per block; per
// warp, the 8 x 16-byte loads of the next batch are in flight while the current batch's
// fragments are read from the buffer and multiplied. The group's expert id is read next to
// num_groups (one dependent latency before the first weight loads instead of two) and the
// first batch's loads are issued before the pair / x lookups. Dynamic shared memory (moe.py
// mma_rows_smem): splits * 4 KiB of staging, then one MmaPartials<8>, + 256 B of alignment
// slack. At most 64 registers (4 blocks of 8 warps per SM).
extern __shared__ uint4 moe_rows_smem[];

// The warp's K range (span = k_end - k_begin elements) of one 16-row tile through the staging
// buffer, accumulated into c in mma_gemv_accumulate's order. wp: byte address of this lane's
// first unit (tile row h, k_begin + ku, ku = 8 (lane % 16)); v: the first batch's loads, already
// issued when span >= full; xp: &x[pair row][k_begin + 8t]; full: MMA_ROWS_K when k_end % 8 != 0
// (the last batch holds a partial unit), else 1; buf / sbuf: the warp buffer (shared-space
// address, 256-byte aligned / generic pointer). The K loop of linear_mma_rows_kernel for one
// tile.
template <typename XT>
__device__ __forceinline__ void mma_rows_tile(const char* wp, i64 hib, i64 rsb, unsigned valid,
                                              int span, int full, int ku, const XT* xp, int t,
                                              int lane, unsigned buf, bf16raw* sbuf,
                                              uint4 (&v)[8], float (&c)[4]) {
  const unsigned st = buf + mma_rows_store_offset(lane), ld = buf + mma_rows_frag_offset(lane);
  int rem = span;  // k left from the batch's k0
  while (rem >= full) {
    __syncwarp();  // the previous batch's fragments are read
    mma_rows_store(st, buf, lane, v);
    __syncwarp();
    const int rn = rem - MMA_ROWS_K;
    if (rn >= full)  // the next batch's loads stay in flight during this batch's mmas
      mma_rows_load(wp + 2 * MMA_ROWS_K, hib, rsb, valid, ku < rn, v);
    mma_rows_batch<0>(ld, xp, 8 * t, rem, c);
    wp += 2 * MMA_ROWS_K;
    xp += MMA_ROWS_K;
    rem = rn;
  }
  if (rem > 0) {  // the warp's last batch holds a partial unit (K % 8 != 0): read element-wise
    __syncwarp();
    mma_rows_store_partial(sbuf, lane, wp, hib, rsb, valid, rem - ku);
    __syncwarp();
    mma_rows_batch<1>(ld, xp, 8 * t, rem, c);
  }
}

// The accumulator fragment c of one tile of moe_mma_rows_kernel: expert e (bad: an id outside
// [0, experts), nothing read, c stays 0), the group's pair slots gp (MOE_GROUP entries, -1
// empty), output rows from m0, K range of split `split`; buf_s / buf: this warp's 4 KiB staging
// buffer (shared-space address, 256-byte aligned / generic pointer). Returns `bad` (carried
// through the K loop in bit 31 of the row mask: a register of its own there spilled at 64
// registers). Shared by the per-stage kernel and the fused decode kernels, so their tiles are
// bitwise the same. XB: p.x holds bf16 bits (rows x_rs elements apart; an act the gate_up stage
// stored as MOE_ACT_BF16_BITS): one mma per k16 step, bitwise the f32 x of the same values.
template <int SWIGLU, int XB = 0>
__device__ __forceinline__ bool moe_rows_tile_c(const MoeGemvParams& p, int e, bool bad,
                                                const int* gp, int m0, int split, int lane,
                                                unsigned buf_s, char* buf, float (&c)[4]) {
  const int g = lane >> 2, t = lane & 3, h = lane >> 4;
  int k_begin, k_end;
  mma_warp_k_range(p.k, p.splits, split, k_begin, k_end);
  // tile row 2j + h (j = 0..7) holds output row m0 + 2j + h (SWIGLU: gate row m0 + 2j + h for
  // j < 4, up row up_offset + m0 + 2(j - 4) + h for j >= 4), as A rows g / g + 8 of
  // moe_mma_kernel; rows past M and every row of a bad expert are never read (zeros)
  const int ku = 8 * (lane & 15);  // this lane's k offset in a batch (loads)
  const i64 rsb = 2 * p.w_rs, hib = (i64)(SWIGLU ? p.up_offset : 8) * rsb;  // bytes
  // bits 0..7: the rows read (none for a bad expert); bit 31: the expert is bad (kept here
  // rather than in a register of its own across the K loop, which spilled at 64 registers)
  const unsigned valid = bad ? 1u << 31 : mma_rows_valid<SWIGLU>(m0, h, p.m);
  const char* wp = reinterpret_cast<const char*>(
      static_cast<const bf16raw*>(p.w) + (i64)(bad ? 0 : e) * p.w_es +
      (i64)(m0 + h) * p.w_rs + k_begin + ku);
  const int span = k_end - k_begin;
  // a batch holds a partial unit iff K % 8 != 0 and it reaches k_end (then k_end = K)
  const int full = (k_end & 7) != 0 ? MMA_ROWS_K : 1;
  uint4 v[8];
  if (span >= full) mma_rows_load(wp, hib, rsb, valid, ku < span, v);
  // x row of pair slot g; an empty slot (-1) reads slot 0's row instead of zeros: it only feeds
  // mma column g, whose outputs are not stored
  const int pr = gp[g];
  const int p0 = __shfl_sync(0xffffffffu, pr, 0);
  const int pa = pr >= 0 ? pr : p0;
  const i64 xo = (i64)(p.x_by_pair ? pa : pa / p.top_k) * p.x_rs + k_begin + 8 * t;
  if constexpr (XB)
    mma_rows_tile(wp, hib, rsb, valid, span, full, ku, reinterpret_cast<const bf16raw*>(p.x) + xo,
                  t, lane, buf_s, reinterpret_cast<bf16raw*>(buf), v, c);
  else
    mma_rows_tile(wp, hib, rsb, valid, span, full, ku, p.x + xo, t, lane, buf_s,
                  reinterpret_cast<bf16raw*>(buf), v, c);
  return (valid >> 31) != 0u;
}

// The first 256-byte boundary of the dynamic shared memory (the launchers add MMA_ROWS_ALIGN
// bytes), so the XOR-swizzled addresses stay inside each warp's staging buffer: its
// shared-space address and generic pointer.
__device__ __forceinline__ char* moe_rows_base(unsigned& base_s) {
  const unsigned s0 = (unsigned)__cvta_generic_to_shared(moe_rows_smem);
  const unsigned pad = (MMA_ROWS_ALIGN - (s0 & (MMA_ROWS_ALIGN - 1))) & (MMA_ROWS_ALIGN - 1);
  base_s = s0 + pad;
  return reinterpret_cast<char*>(moe_rows_smem) + pad;
}

// Guard of the fused kernels' dynamic shared memory layout (moe_rows_base's alignment pad plus
// `used` bytes from there): traps (a launch failure naming the kernel under NINFER_CUDA_SYNC=1)
// instead of reading and writing past the block's allocation (cudaErrorIllegalAddress, or
// silently another block's data) when the launcher's size and the kernel's layout disagree.
__device__ __forceinline__ void moe_rows_smem_check(unsigned base_s, unsigned used) {
  unsigned dyn;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  const unsigned s0 = (unsigned)__cvta_generic_to_shared(moe_rows_smem);
  if (base_s - s0 + used > dyn) __trap();
}

template <int SWIGLU, int XB>
__global__ void __launch_bounds__(256, 4) moe_mma_rows_kernel(const MoeGemvParams p) {
  pdl_enter();
  const int grp = blockIdx.y;
  // group_expert has N*K entries (the grid's y extent): in bounds past num_groups too
  const int groups = *p.num_groups, e = p.group_expert[grp];
  if (grp >= groups) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int TILE = SWIGLU ? 8 : 16;  // output rows per block
  const int m0 = blockIdx.x * TILE;
  unsigned base_s;
  char* const base = moe_rows_base(base_s);
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const bool bad = moe_rows_tile_c<SWIGLU, XB>(
      p, e, e < 0 || e >= p.experts, p.group_pairs + grp * MOE_GROUP, m0, warp, lane,
      base_s + warp * (MMA_ROWS_UNITS * 16), base + warp * (MMA_ROWS_UNITS * 16), c);
  MmaPartials<8>& red = *reinterpret_cast<MmaPartials<8>*>(base + p.splits * (MMA_ROWS_UNITS * 16));
  mma_store_partials(red, warp, lane >> 2, lane & 3, c);
  __syncthreads();
  moe_mma_store<SWIGLU>(p, red, p.group_pairs + grp * MOE_GROUP, m0, bad);
}

// The norm fold's producer for an MoE block (NINFER_NORM_FOLD; linear.cu TMA_IO_RESID_NORM's
// contract): NF = 1 instances of moe_combine_kernel and moe_fused_down_kernel do not store out;
// each output element's acc goes into the residual stream instead, r = f.res[n, j] + acc (stored
// back), f.xg[n, j] = bf16(r * f.gain[j]), and f.parts[n, g] = the sum of r^2 over the 16 columns
// [16 g, 16 g + 16) of H (those < H, in column order): both kernels partition and sum alike, so
// every path gives the same bits (batch invariance). The next layer's input projections divide
// by sqrt(sum(parts[n]) / H + eps) (linear.cu TMA_IO_ROW_NORM).
struct MoeNormFold {
  float* res;         // the residual stream [N, H], rows res_rs apart, updated in place
  const float* gain;  // the next norm's 1 + w [H] (f32)
  bf16raw* xg;        // the next layer's x [N, H] as bf16 bits, rows xg_rs apart
  float* parts;       // [N, ceil(H / 16)], rows parts_rs apart
  i64 res_rs, xg_rs, parts_rs;
};
static_assert(sizeof(MoeNormFold) == 56, "mirrored in moe.py");

// One output element's fold (MoeNormFold); returns r^2 for its column group's sum.
__device__ __forceinline__ float moe_fold_store(const MoeNormFold& f, i64 n, int j, float acc) {
  float* rp = f.res + n * f.res_rs + j;
  const float r = *rp + acc;
  *rp = r;
  f.xg[n * f.xg_rs + j] = f32_to_bf16(r * f.gain[j]);
  return r * r;
}

// parts[n, g] of MoeNormFold: the sum in column order of sq[0 .. 15] (columns 16 g + r < m).
__device__ __forceinline__ void moe_fold_part(const MoeNormFold& f, i64 n, int g, int m,
                                              const float* sq) {
  float t = 0.0f;
  for (int r = 0; r < 16 && 16 * g + r < m; ++r) t += sq[r];
  f.parts[n * f.parts_rs + g] = t;
}

// out[n, :] = sum_k (ascending expert id) w[n, k] * y[row(n, k), :]; row = pair_row[n*K+k] or
// the pair itself when pair_row is null; then, when `shared` is not null, out[n, :] +=
// sigmoid(gate[n]) * shared[n, :] with elementwise.cu SigmoidScaleAdd's expression, so the result
// is bitwise that of moe_combine then sigmoid_scale_add. Grid (N, ceil(H / 256)), 256 threads,
// one column each. NF = 1: the norm fold (MoeNormFold) instead of out; block (n, y) writes the
// parts of its 16 column groups.
// The top_k ids of a row are distinct: pair k goes to position rank(k) = #{k' : id[k'] < id[k]},
// computed by top_k threads in parallel (a serial sort on one thread waited on ~30 dependent
// global loads, 23 us per launch at the 35B-A3B shape).
template <int NF>
__global__ void __launch_bounds__(256) moe_combine_kernel(const float* __restrict__ y, i64 y_rs,
                                                          const int* __restrict__ pair_row,
                                                          const int* __restrict__ ids,
                                                          const float* __restrict__ w, i64 w_rs,
                                                          int top_k, int hidden,
                                                          const float* __restrict__ shared,
                                                          i64 shared_rs,
                                                          const float* __restrict__ gate,
                                                          i64 gate_rs, float* __restrict__ out,
                                                          i64 out_rs, const MoeNormFold nf) {
  __shared__ int s_id[64];
  __shared__ i64 s_row[64];  // y row offset (elements) of the pair at each rank
  __shared__ float s_w[64];  // its weight
  __shared__ float s_sq[NF ? 256 : 1];  // NF: r^2 by column of the block
  pdl_enter();
  const i64 n = blockIdx.x;
  const int k = threadIdx.x;
  if (k < top_k) s_id[k] = ids[n * top_k + k];
  __syncthreads();
  if (k < top_k) {
    const int id = s_id[k];
    int rank = 0;
    for (int k2 = 0; k2 < top_k; ++k2) rank += s_id[k2] < id;
    const i64 pr = n * top_k + k;
    s_row[rank] = (pair_row ? (i64)pair_row[pr] : pr) * y_rs;
    s_w[rank] = w[n * w_rs + k];
  }
  __syncthreads();
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (!NF && j >= hidden) return;
  if (j < hidden) {
    float acc = 0.0f;
    for (int i = 0; i < top_k; ++i) acc += s_w[i] * y[s_row[i] + j];
    if (shared) acc = acc + sigmoid_f(gate[n * gate_rs]) * shared[n * shared_rs + j];
    if constexpr (NF)
      s_sq[threadIdx.x] = moe_fold_store(nf, n, j, acc);
    else
      out[n * out_rs + j] = acc;
  }
  if constexpr (NF) {
    __syncthreads();
    const int g = blockIdx.y * (blockDim.x / 16) + threadIdx.x;  // a 16-column group
    if ((int)threadIdx.x < (int)blockDim.x / 16 && 16 * g < hidden)
      moe_fold_part(nf, n, g, hidden, s_sq + 16 * threadIdx.x);
  }
}

// ---- Fused decode path (moe.py FUSED): routing + grouping + gate_up, then down + combine ----
// At most MOE_FUSED_PAIRS (row, slot) pairs (N <= 8 rows of top_k <= 8 at the 35B-A3B shape).
#define MOE_FUSED_PAIRS 64
#define MOE_DOWN_SLOTS 8  // moe_fused_down_kernel: groups in flight per block (named barriers 1..8)
#define MOE_FUSED_ROWS 8  // moe_fused_down_kernel: token rows (moe.py FUSED_MAX_ROWS)
#define MOE_DOWN_SHARED_WARPS 4  // moe_fused_down_kernel: the folded shared down's team
#define MOE_DOWN_MAX_WARPS 20    // moe_fused_down_kernel: 16 expert warps + the shared team
#define MOE_SHARED_MAX_CONS 16   // MoeSharedDown.cons <= this (4 per team warp)
#define MOE_DOWN_PREFETCH 1      // moe_fused_down_kernel prewait flags (see the kernel)
#define MOE_DOWN_SHARED_EARLY 2

// The shared expert's down projection folded into moe_fused_down_kernel: linear(x, w) as
// linear_tma_kernel<0, sk, cons, *, *, 0> computes it (f32 x).
struct MoeSharedDown {
  const bf16raw* w;  // [m, k] bf16, rows w_rs apart (16-byte aligned); null: nothing folds
  const float* x;    // [N, k] f32 (the shared act), rows x_rs apart (16-byte aligned)
  i64 w_rs, x_rs;
  int m, k;      // k % 16 == 0
  int sk, cons;  // linear_tma_kernel's geometry: k per stage, consumer warps (<= 16)
};
static_assert(sizeof(MoeSharedDown) == 48, "MoeSharedDown layout is mirrored in moe.py");

// Shared-memory row pitches of the staged tile (bytes; 16 bytes of padding: the 8 rows a
// quarter-warp reads fall in distinct banks) and x rows (floats; 32 bytes of padding).
__host__ __device__ constexpr int moe_shared_a_pitch(int k) { return 2 * k + 16; }
__host__ __device__ constexpr int moe_shared_x_pitch(int k) { return k + 8; }

// 16 bytes from global `src` to shared address `dst` (both 16-byte aligned), asynchronously
// (sm_80 cp.async, L2 only); cp_async_wait_all waits for this thread's copies.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// The accumulator fragments c[v] of consumer warps cw0 + v cw_step (v < NV; those >= cons are
// skipped) of linear_tma_kernel<0, sk, cons, *, *, 0> (linear.cu) for one 16-row tile, from
// operands in shared memory: `a`, the tile's rows (k 0..K-1, a_pitch bytes apart; rows past M
// arbitrary: they only feed their own outputs), xg, this lane's x row (lane (g, t): row g of the
// column tile; k 0..K-1, f32). Per consumer warp as that kernel: for each stage s in order, the
// warp's k16 steps of [s sk + cw sk / cons, + sk / cons) inside K in order, A fragment rows g,
// g + 8 at k + 2t, k + 2t + 1 and k + 8 + 2t, k + 9 + 2t (its ldmatrix.x4), x at the same k split
// into bf16 hi + lo words, the hi product first (tma_step<4>): bitwise its c. The NV chains are
// independent and interleave.
template <int NV>
__device__ __forceinline__ void tma_gemv_warps_c(const char* a, int a_pitch, const float* xg,
                                                 int k, int sk, int cons, int cw0, int cw_step,
                                                 int lane, float (&c)[NV][4]) {
  const int g = lane >> 2, t = lane & 3, wk = sk / cons;
  const char* a0 = a + g * a_pitch + 4 * t;
  const char* a1 = a0 + 8 * a_pitch;
  for (int s0 = 0; s0 < k; s0 += sk) {
    for (int j = 0; 16 * j < wk; ++j) {
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        const int cw = cw0 + v * cw_step;
        const int kk = s0 + cw * wk + 16 * j;  // + 2t: this lane's first element
        if (cw >= cons || kk >= k) continue;   // K % 16 == 0: whole steps
        const unsigned w0 = *reinterpret_cast<const unsigned*>(a0 + 2 * kk);
        const unsigned w1 = *reinterpret_cast<const unsigned*>(a1 + 2 * kk);
        const unsigned w2 = *reinterpret_cast<const unsigned*>(a0 + 2 * kk + 16);
        const unsigned w3 = *reinterpret_cast<const unsigned*>(a1 + 2 * kk + 16);
        const float2 x0 = *reinterpret_cast<const float2*>(xg + kk + 2 * t);
        const float2 x1 = *reinterpret_cast<const float2*>(xg + kk + 2 * t + 8);
        unsigned xf[4];
        split_bf16x2(x0.x, x0.y, xf[0], xf[2]);
        split_bf16x2(x1.x, x1.y, xf[1], xf[3]);
        mma_bf16_16816(c[v], w0, w1, w2, w3, xf[0], xf[1]);
        mma_bf16_16816(c[v], w0, w1, w2, w3, xf[2], xf[3]);
      }
    }
  }
}

// moe_fused_down_kernel's shared team (warp tw of MOE_DOWN_SHARED_WARPS, thread tt of the team):
// stages the N x rows of sd at shared address x_s (cp.async; the weight tile at `a` is being
// staged by the same threads' earlier copies), computes the partials of linear_tma_kernel's
// sd.cons consumer warps into red and their split sum into ys[n * 16 + r] (rows m0 + r < M,
// n < N).
__device__ __forceinline__ void moe_shared_down_tile(const MoeSharedDown& sd, int n_rows, int m0,
                                                  const char* a, unsigned x_s, const float* x,
                                                  MmaPartials<16>& red, float* ys, int tw,
                                                  int tt) {
  constexpr int TEAM = 32 * MOE_DOWN_SHARED_WARPS;
  constexpr int NV = MOE_SHARED_MAX_CONS / MOE_DOWN_SHARED_WARPS;
  const int x_pitch = moe_shared_x_pitch(sd.k), a_pitch = moe_shared_a_pitch(sd.k);
  const int units = sd.k >> 2;  // 16-byte units of an x row
  for (int u = tt; u < n_rows * units; u += TEAM) {
    const int n = u / units, c = u - n * units;
    cp_async_16(x_s + 4 * (n * x_pitch + 4 * c), sd.x + (i64)n * sd.x_rs + 4 * c);
  }
  cp_async_wait_all();
  asm volatile("bar.sync %0, %1;" ::"r"(1 + MOE_DOWN_SLOTS), "r"(TEAM) : "memory");
  const int lane = tt & 31;
  float c[NV][4];
#pragma unroll
  for (int v = 0; v < NV; ++v) c[v][0] = c[v][1] = c[v][2] = c[v][3] = 0.0f;
  // x rows past N read row N - 1 (their outputs are not stored)
  tma_gemv_warps_c<NV>(a, a_pitch, x + min(lane >> 2, n_rows - 1) * x_pitch, sd.k, sd.sk,
                       sd.cons, tw, MOE_DOWN_SHARED_WARPS, lane, c);
#pragma unroll
  for (int v = 0; v < NV; ++v)
    if (tw + v * MOE_DOWN_SHARED_WARPS < sd.cons)
      mma_store_partials(red, tw + v * MOE_DOWN_SHARED_WARPS, lane >> 2, lane & 3, c[v]);
  asm volatile("bar.sync %0, %1;" ::"r"(1 + MOE_DOWN_SLOTS), "r"(TEAM) : "memory");
  for (int idx = tt; idx < 16 * 8; idx += TEAM) {
    const int r = idx >> 3, n = idx & 7;
    if (m0 + r < sd.m && n < n_rows) ys[n * 16 + r] = mma_reduce_partials<0>(red, sd.cons, r, n);
  }
}

// moe_fused_gate_up_kernel<J>: moe_route_group_kernel<J> and moe_mma_rows_kernel<1> in one
// launch. Grid (ceil(Im / 8), N*K), blockDim.x = 32 * max(splits, ceil(N*K / 32)) (<= 256).
// Every block routes all N rows (moe_route_row, one warp per row) and groups the pairs
// (moe_group_block) into shared memory: the same functions as moe_route_group_kernel, so the
// same weights, ids and group tables. Block (0, 0) also writes them to w_out / ids_out and to
// p.group_* (for moe_fused_down_kernel); block (x, g) then computes tile x of group g exactly as
// moe_mma_rows_kernel<1> does (moe_rows_tile_c, warps >= splits have an empty K range and add
// nothing), so act is bitwise that of the per-stage path. Dynamic shared memory: mma_rows_smem
// of the block's warps.
// moe_fused_gate_up_kernel's prologue (not inlined: its registers then do not compete with the
// K loop's, which spilled at 64 registers): routing and grouping into the block's shared tables;
// the lead block also writes them to global memory.
template <int J>
__device__ __noinline__ void moe_fused_route_group(const MoeGemvParams& p,
                                                   const float* __restrict__ logits,
                                                   i64 logits_rs, int n_rows, float* w_out,
                                                   i64 w_rs, int* ids_out, i64 ids_rs, int* s_ids,
                                                   float* s_w, int* s_gexp, int* s_gpairs,
                                                   int* s_groups) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool lead = blockIdx.x == 0 && blockIdx.y == 0;
  const int top_k = p.top_k, n_pairs = n_rows * top_k;
  for (int n = warp; n < n_rows; n += blockDim.x >> 5)
    moe_route_row<J>(logits + (i64)n * logits_rs, p.experts, top_k, lane,
                     lead ? w_out + (i64)n * w_rs : s_w + n * top_k,
                     lead ? ids_out + (i64)n * ids_rs : s_ids + n * top_k, s_ids + n * top_k);
  __syncthreads();
  moe_group_block(s_ids, n_pairs, MOE_GROUP, s_gexp, s_gpairs, s_groups);
  __syncthreads();
  if (lead) {  // the group tables' buffers are the workspace's (read-only for the stage kernels)
    for (int i = threadIdx.x; i < n_pairs * MOE_GROUP; i += blockDim.x) {
      const_cast<int*>(p.group_pairs)[i] = s_gpairs[i];
      if (i < n_pairs) const_cast<int*>(p.group_expert)[i] = s_gexp[i];
    }
    if (threadIdx.x == 0) *const_cast<int*>(p.num_groups) = *s_groups;
  }
}

template <int J>
__global__ void __launch_bounds__(256, 4) moe_fused_gate_up_kernel(
    const MoeGemvParams p, const float* __restrict__ logits, i64 logits_rs, int n_rows,
    float* __restrict__ w_out, i64 w_rs, int* __restrict__ ids_out, i64 ids_rs) {
  __shared__ int s_ids[MOE_FUSED_PAIRS];
  __shared__ float s_w[MOE_FUSED_PAIRS];
  __shared__ int s_gexp[MOE_FUSED_PAIRS];
  __shared__ int s_gpairs[MOE_FUSED_PAIRS * MOE_GROUP];
  __shared__ int s_groups;
  pdl_enter();
  moe_fused_route_group<J>(p, logits, logits_rs, n_rows, w_out, w_rs, ids_out, ids_rs, s_ids, s_w,
                           s_gexp, s_gpairs, &s_groups);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if ((int)blockIdx.y >= s_groups) return;
  const int e = s_gexp[blockIdx.y];
  unsigned base_s;
  char* const base = moe_rows_base(base_s);  // the partials, then the warps' staging buffers
  // sizeof(MmaPartials<8>) = 4 KiB: moe.py passes mma_rows_smem(warps) = warps * 4 KiB + one
  // MmaPartials<8> + 256 B. (It was 16 * 16 * 8 * 4 = sizeof(MmaPartials<16>), 12 KiB more than
  // allocated: the staging buffers of the last warps lay past the block's dynamic shared memory,
  // cudaErrorIllegalAddress on the H200.)
  constexpr int RED = (int)sizeof(MmaPartials<8>);
  static_assert(RED % MMA_ROWS_ALIGN == 0, "the staging buffers stay 256-byte aligned");
  moe_rows_smem_check(base_s, RED + (blockDim.x >> 5) * (MMA_ROWS_UNITS * 16));
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const bool bad = moe_rows_tile_c<1>(
      p, e, e < 0 || e >= p.experts, s_gpairs + blockIdx.y * MOE_GROUP, blockIdx.x * 8, warp,
      lane, base_s + RED + warp * (MMA_ROWS_UNITS * 16),
      base + RED + warp * (MMA_ROWS_UNITS * 16), c);
  MmaPartials<8>& red = *reinterpret_cast<MmaPartials<8>*>(base);
  if (warp < p.splits) mma_store_partials(red, warp, lane >> 2, lane & 3, c);
  __syncthreads();
  moe_mma_store<1>(p, red, s_gpairs + blockIdx.y * MOE_GROUP, blockIdx.x * 8, bad);
}

// moe_fused_down_kernel: moe_mma_rows_kernel<0> over every group and moe_combine_kernel in one
// launch. Grid ceil(H / 16): block b owns output columns [16 b, 16 b + 16) of every row, so no
// other block adds into them (no atomics). Warps form `slots` = min(MOE_DOWN_SLOTS,
// warps / splits) teams of `splits` warps; team s walks the groups s, s + slots, ... and computes
// each group's 16-row tile exactly as moe_mma_rows_kernel<0> (moe_rows_tile_c, warp = split,
// partials summed in split order, NaN for a bad expert) into y[pair][r] in shared memory (a
// named barrier per team between the partials and their sum). Then thread (n, r) adds, as
// moe_combine_kernel does, sum over k in ascending expert id of w[n, k] * y[pair(n, k)][r]
// (acc += w * y from 0.0f), then acc + sigmoid(gate[n]) * shared[n, j] when `shared` is given:
// bitwise the per-stage path's out. p: the down stage (x = act by pair; out unused); w / ids:
// the routing (written by moe_fused_gate_up_kernel). blockDim.x = 32 * warps with splits <=
// warps <= 16 (+ MOE_DOWN_SHARED_WARPS with a folded shared down); dynamic shared memory (moe.py
// fused_down_smem): warps * 4 KiB of staging, then slots * splits partial tiles of 16 x 8
// floats, + 256 B of alignment slack.
// sd.w != null (moe.py shared_down_folds; NINFER_MOE_FOLD_SHARED): the shared expert's down
// projection runs in this launch too, on a team of MOE_DOWN_SHARED_WARPS extra warps (the last
// ones; named barrier 1 + MOE_DOWN_SLOTS), bitwise what `linear(sd.x, sd.w)` computes with
// linear_tma_kernel<0, sd.sk, sd.cons, *, *, 0> (f32 x): the block's 16-row tile of sd.w (a
// constant: staged into shared memory before pdl_wait) and the N rows of sd.x are staged in
// shared memory, the team computes the partial of each of that kernel's sd.cons consumer warps
// (moe_shared_down_tile) into s_ys by the same split sum, and the combine adds sigmoid(gate[n])
// * s_ys[n][r] in place of shared[n, j]. Dynamic shared memory after the experts' (moe.py
// fused_down_smem): the tile (16 rows moe_shared_a_pitch bytes apart), MOE_FUSED_ROWS x rows
// (moe_shared_x_pitch floats apart), sd.cons partial tiles of 16 x 8 floats.
// prewait (bit flags, moe.py):
// - MOE_DOWN_PREFETCH (NINFER_MOE_DOWN_PREWAIT): before pdl_wait, the block prefetches into the
//   L2 the down rows of its tile for every group, reading the group tables without waiting.
//   Only hints: where the tables were written before the gate_up stage they are complete by
//   then (that stage lets this kernel launch only after its own pdl_wait, so every kernel
//   before it has completed); where not, a stale table only prefetches the wrong lines.
// - MOE_DOWN_SHARED_EARLY: the shared team computes its tile before pdl_wait. The launcher sets
//   it only after moe_tma_gate_up_kernel, which waits before it triggers this launch: sd.x,
//   written before that stage, is complete when this kernel starts.
// NF = 1: the norm fold (MoeNormFold) in place of out; the block writes parts[n, blockIdx.x].
template <int XB, int NF>
__global__ void __launch_bounds__(32 * MOE_DOWN_MAX_WARPS, 1) moe_fused_down_kernel(
    const MoeGemvParams p, const MoeSharedDown sd, const float* __restrict__ w, i64 w_rs,
    const int* __restrict__ ids, int n_rows, const float* __restrict__ shared, i64 shared_rs,
    const float* __restrict__ gate, i64 gate_rs, float* __restrict__ out, i64 out_rs,
    int prewait, const MoeNormFold nf) {
  __shared__ float s_y[MOE_FUSED_PAIRS * 16];
  __shared__ float s_sq[NF ? MOE_FUSED_ROWS * 16 : 1];  // NF: r^2 by [n][r]
  __shared__ float s_ys[MOE_FUSED_ROWS * 16];  // the folded shared down: [n][r]
  __shared__ int s_pair[MOE_FUSED_PAIRS];  // [n][rank]: the pair of row n's rank-th expert
  __shared__ float s_cw[MOE_FUSED_PAIRS];  // its weight
  const TimelineMarks marks;  // (phase marks: timeline build only)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool fold = sd.w != nullptr;
  const int splits = p.splits, warps = blockDim.x >> 5;
  const int s_warps = fold ? MOE_DOWN_SHARED_WARPS : 0;  // the shared team: the last warps
  const int e_warps = warps - s_warps;
  const int slots = min(MOE_DOWN_SLOTS, e_warps / splits);
  const int m0 = blockIdx.x * 16;
  unsigned base_s;
  char* const base = moe_rows_base(base_s);
  const unsigned parts = e_warps * (MMA_ROWS_UNITS * 16) + slots * splits * (16 * 8 * 4);
  const int a_pitch = moe_shared_a_pitch(sd.k), x_pitch = moe_shared_x_pitch(sd.k);
  const unsigned a_bytes = 16 * a_pitch, x_bytes = MOE_FUSED_ROWS * x_pitch * 4;
  moe_rows_smem_check(base_s, parts + (fold ? a_bytes + x_bytes + sd.cons * (16 * 8 * 4) : 0));
  const bool shared_team = warp >= e_warps;
  const int tt = threadIdx.x - 32 * e_warps;  // (shared team only)
  MmaPartials<16>& s_red = *reinterpret_cast<MmaPartials<16>*>(base + parts + a_bytes + x_bytes);
  if (shared_team) {  // the tile of the constant shared down weights, before pdl_wait
    const int units = sd.k >> 3;  // 16-byte units per row
    for (int u = tt; u < 16 * units; u += 32 * MOE_DOWN_SHARED_WARPS) {
      const int r = u / units, c = u - r * units;
      if (m0 + r < sd.m)
        cp_async_16(base_s + parts + r * a_pitch + 16 * c, sd.w + (i64)(m0 + r) * sd.w_rs + 8 * c);
    }
    if (prewait & MOE_DOWN_SHARED_EARLY)
      moe_shared_down_tile(sd, n_rows, m0, base + parts, base_s + parts + a_bytes,
                           reinterpret_cast<const float*>(base + parts + a_bytes), s_red, s_ys,
                           warp - e_warps, tt);
  }
  if (prewait & MOE_DOWN_PREFETCH) {  // L2 prefetch of this block's down rows (16 per group) before pdl_wait
    const int groups = min(__ldcg(p.num_groups), MOE_FUSED_PAIRS);
    const i64 row_b = 2 * (i64)p.w_rs, m0 = (i64)blockIdx.x * 16;
    for (int grp = 0; grp < groups; ++grp) {
      const int e = __ldcg(p.group_expert + grp);
      if (e >= 0 && e < p.experts)
        prefetch_l2_span(static_cast<const char*>(p.w) + 2 * (i64)e * p.w_es + m0 * row_b,
                         min((i64)16, p.m - m0) * row_b, threadIdx.x, blockDim.x);
    }
  }
  pdl_enter();
  timeline_mark(0);
  const int top_k = p.top_k, n_pairs = n_rows * top_k;
  for (int q = threadIdx.x; q < n_pairs; q += blockDim.x) {
    const int n = q / top_k, k = q - n * top_k, id = ids[q];
    int rank = 0;
    for (int k2 = 0; k2 < top_k; ++k2) rank += ids[n * top_k + k2] < id;
    s_pair[n * top_k + rank] = q;
    s_cw[n * top_k + rank] = w[n * w_rs + k];
  }
  const int slot = warp / splits, split = warp - slot * splits;
  const int groups = *p.num_groups;
  if (shared_team) {  // linear(sd.x, sd.w)'s tile, as linear_tma_kernel computes it
    if (!(prewait & MOE_DOWN_SHARED_EARLY))
      moe_shared_down_tile(sd, n_rows, m0, base + parts, base_s + parts + a_bytes,
                           reinterpret_cast<const float*>(base + parts + a_bytes), s_red, s_ys,
                           warp - e_warps, tt);
  } else if (slot < slots) {
    MmaPartials<8>& red = *reinterpret_cast<MmaPartials<8>*>(
        base + e_warps * (MMA_ROWS_UNITS * 16) + slot * splits * (16 * 8 * 4));
    const int team = splits * 32, tt = threadIdx.x - slot * team;
    for (int grp = slot; grp < groups; grp += slots) {
      const int e = p.group_expert[grp];
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const bool bad = moe_rows_tile_c<0, XB>(
          p, e, e < 0 || e >= p.experts, p.group_pairs + grp * MOE_GROUP, m0, split, lane,
          base_s + warp * (MMA_ROWS_UNITS * 16), base + warp * (MMA_ROWS_UNITS * 16), c);
      mma_store_partials(red, split, lane >> 2, lane & 3, c);
      asm volatile("bar.sync %0, %1;" ::"r"(1 + slot), "r"(team) : "memory");
      for (int idx = tt; idx < 16 * 8; idx += team) {
        const int r = idx >> 3, n = idx & 7;
        const int pn = p.group_pairs[grp * MOE_GROUP + n];
        if (m0 + r >= p.m || pn < 0) continue;
        float v = mma_reduce_partials<0>(red, splits, r, n);
        if (bad) v = NINFER_NAN;
        s_y[pn * 16 + r] = v;
      }
      asm volatile("bar.sync %0, %1;" ::"r"(1 + slot), "r"(team) : "memory");
    }
  }
  __syncthreads();
  timeline_mark(1);  // every group's tile summed
  for (int idx = threadIdx.x; idx < n_rows * 16; idx += blockDim.x) {
    const int n = idx >> 4, r = idx & 15, j = m0 + r;
    if (j >= p.m) continue;
    float acc = 0.0f;
    for (int i = 0; i < top_k; ++i) acc += s_cw[n * top_k + i] * s_y[s_pair[n * top_k + i] * 16 + r];
    if (fold)
      acc = acc + sigmoid_f(gate[n * gate_rs]) * s_ys[n * 16 + r];
    else if (shared)
      acc = acc + sigmoid_f(gate[n * gate_rs]) * shared[n * shared_rs + j];
    if constexpr (NF)
      s_sq[idx] = moe_fold_store(nf, n, j, acc);
    else
      out[n * out_rs + j] = acc;
  }
  if constexpr (NF) {
    __syncthreads();
    if ((int)threadIdx.x < n_rows && m0 < p.m)
      moe_fold_part(nf, threadIdx.x, blockIdx.x, p.m, s_sq + 16 * threadIdx.x);
  }
}

// ---- moe_tma_gate_up_kernel: the gate_up + SwiGLU stage on a bulk-copy ring (sm_90) ----
// Same contract and bits as moe_mma_rows_kernel<1> (x_by_pair = 0 or 1 as in p), with the
// weight tiles streamed into shared memory by the TMA engine instead of register-staged loads.
// Block = p.splits consumer warps + 1 producer warp, persistent: block b walks the work items
// i = b, b + gridDim.x, ... < num_groups * tiles (tiles = ceil(M / 8); group i / tiles, output
// rows m0 = 8 (i % tiles)). An item's 16 A rows are those of moe_mma_rows_kernel<1> (tile row
// r < 8: gate row m0 + r; r >= 8: up row up_offset + m0 + r - 8) and its K is cut into
// NS = splits / sw ring stages of sk = sw * (the warps' K range length) k: stage s holds the K
// ranges (mma_warp_k_range) of consumer warps s sw .. s sw + sw - 1, one bulk copy per live row
// (lanes 0..15 of the producer; rows past M and every row of a bad expert are not copied),
// rows moe_tma_pitch(sk) bytes apart (= 64 mod 128: the 16-byte reads of a quarter warp, rows
// g and g + 1 at the same k, cover the 32 banks once).
// Consumer warp w (= split w) waits on its stage, then for each 32-k step k0 of its range in
// ascending order: lane (g, t) reads w0 = A[g][k0 + 8t .. +7], w1 = A[g + 8][same] (zeros where
// k0 + 8t >= k_end, as mma_load_w / mma_rows_load) and x[pair row of slot g][k0 + 8t .. +7]
// (zeros there too; an empty slot reads slot 0's row, as moe_rows_tile_c), splits x into bf16
// hi + lo (split_bf16x2) and runs the 4 mmas of mma_gemv_accumulate's step (words x/y with
// x[0..3]: hi then lo; words z/w with x[4..7]: hi then lo): exactly the fragments and order
// that moe_mma_rows_kernel<1> hands to the tensor cores (its stmatrix / ldmatrix transpose
// yields these registers). Partials go to red[split] and the outputs are
// mma_reduce_partials<1> over the splits in order (moe_mma_store: silu(gate) * up, NaN for a
// bad expert, rows past M and empty slots not stored). Arbitrary (stale) shared memory in rows
// that are not copied only feeds A rows whose outputs are not stored (an mma's outputs depend
// only on their own A row and B column).
// Ring protocol: a slot's n-th use is filled by the producer (after the slot's empty barrier
// completed use n - 1) and read by the sw warps of its stage, who wait on its full barrier with
// parity n & 1; `stages` is a multiple of NS, so slot i always holds stage i % NS and every warp
// sees each use of its slots in order (a parity wait is only exact for the phase that follows
// the last one the waiter saw). After each item (or pair of items) the consumer warps meet at
// named barrier 1; the partials alternate between two buffer sets (as linear_tma_kernel).
// Dynamic shared memory (moe.py tma_gate_up_plan): full[stages], empty[stages] barriers
// (MOE_TMA_BAR_BYTES), four MmaPartials<8> (two items, double-buffered), the ring of `stages`
// stages of 16 pitch bytes.
// pairs = 1 (moe.py MOE_TMA_PAIRS): consumers take the block's items two at a time (see
// moe_tma_consume) when the ring holds two items; the same bits as one at a time.
#define MOE_TMA_PAD 64
#define MOE_TMA_MAX_STAGES 16
#define MOE_TMA_BAR_BYTES 256
#define MOE_TMA_U 4  // 32-k steps whose shared / x loads are issued together
#ifndef MOE_TMA_XPIPE
#define MOE_TMA_XPIPE 0
#endif

// Bytes between the ring's rows for stages of sk k (sk % 32 == 0): 2 sk rounded up to 64 mod
// 128 (adds 0 or MOE_TMA_PAD bytes).
__device__ __forceinline__ int moe_tma_pitch(int sk) {
  return 2 * sk + MOE_TMA_PAD - ((2 * sk) & MOE_TMA_PAD);
}

__device__ __forceinline__ uint4 moe_lds16(unsigned a) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}

// One work item of a consumer warp: its group's pair slots gp, output rows from m0, expert e and
// the x row of pair slot g (an empty slot reads slot 0's row: it only feeds mma column g,
// whose outputs are not stored), at this lane's first k (+ 8 t added by the caller's k). XB:
// x holds bf16 bits (p.x_rs in elements), xp then points at that row's bf16 elements.
struct MoeTmaItem {
  const float* xp;
  const int* gp;
  int m0, e;
};
template <int XR, int XB = 0>
__device__ __forceinline__ MoeTmaItem moe_tma_item(const MoeGemvParams& p, int item, int tiles,
                                                   int g) {
  MoeTmaItem it;
  const int grp = item / tiles;
  it.m0 = (item - grp * tiles) * 8;
  it.e = p.group_expert[grp];
  it.gp = p.group_pairs + grp * MOE_GROUP;
  if (XR) {  // every pair reads x row 0 (held in registers; xp unused)
    it.xp = p.x;
    return it;
  }
  const int pr = it.gp[g];
  const int p0 = __shfl_sync(0xffffffffu, pr, 0);
  const int pa = pr >= 0 ? pr : p0;
  const i64 row = (i64)(p.x_by_pair ? pa : pa / p.top_k) * p.x_rs;
  it.xp = XB ? reinterpret_cast<const float*>(reinterpret_cast<const bf16raw*>(p.x) + row)
             : p.x + row;
  return it;
}

// A consumer warp's K range [k_begin, k_end) of NI (1 or 2) items whose stages sit at shared
// addresses a[j] (this lane's first unit): for each item, lane (g, t) reads w0 = A[g][k0 + 8t ..
// + 7], w1 = A[g + 8][same] (zeros where k0 + 8t >= k_end) and x[k0 + 8t .. + 7], and runs
// mma_step_x8 into c[j] for the 32-k steps k0 in ascending order: per item exactly the
// fragments and order of moe_mma_rows_kernel<1>. The items' loads are issued together and their
// mma chains interleave (independent accumulators). XS: x is in shared memory (generic loads),
// else read through the read-only path.
// MOE_TMA_XPIPE (moe.py SOURCE_XPIPE, NINFER_MOE_TMA_XPIPE): each batch's x loads are issued
// before the previous batch's mmas (two batches of x in flight per warp instead of one: at B > 1
// the consumers' time per item is mostly x loads crossing the L2 behind the weight stream); the
// same steps, fragments and mma order.
// XB: x_0 / x_1 point at bf16 bits (moe_tma_item<*, 1>); a unit is one 16-byte load, already
// the hi words, and the lo products (exactly 0 for an f32 x holding bf16 values) are skipped:
// bitwise the f32 x of the same values (mma_step_bf16x8).
template <int NI, bool XS = false, int XB = 0>
__device__ __forceinline__ void moe_tma_consume(unsigned a_0, unsigned a_1, int pitch,
                                                const float* x_0, const float* x_1, int k_begin,
                                                int k_end, int t, float (&c)[2][4]) {
  constexpr int U = NI == 1 ? MOE_TMA_U : MOE_TMA_U / 2;  // the same loads in flight
  unsigned a[2] = {a_0, a_1};
  const float* xp[2] = {x_0, x_1};
  // item j's x[k .. k + 7] (zeros from k_end: K % 8 == 0, so a unit is whole or out); XB: the
  // 8 bf16 values' bits in ya, yb unused
  auto load_x = [&](int j, int k, float4& ya, float4& yb) {
    const bool in = k < k_end;
    const float4 zf = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (XB) {
      static_assert(!XS, "x in shared memory is f32");
      const float4* xq =
          reinterpret_cast<const float4*>(reinterpret_cast<const bf16raw*>(xp[j]) + k);
      ya = in ? __ldg(xq) : zf;
      yb = zf;
      return;
    }
    const float4* x4 = reinterpret_cast<const float4*>(xp[j] + k);
    ya = in ? (XS ? x4[0] : __ldg(x4)) : zf;
    yb = in ? (XS ? x4[1] : __ldg(x4 + 1)) : zf;
  };
  // MOE_TMA_XPIPE: the batch at k0's x, loaded before the loop / during the previous batch
  auto load_batch_x = [&](int k0, float4 (&ya)[NI][U], float4 (&yb)[NI][U]) {
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int i = 0; i < U; ++i) load_x(j, k0 + 32 * i + 8 * t, ya[j][i], yb[j][i]);
  };
  float4 xa[NI][U], xb[NI][U];
  if constexpr (MOE_TMA_XPIPE) load_batch_x(k_begin, xa, xb);
  for (int k0 = k_begin; k0 < k_end; k0 += 32 * U) {
    uint4 w0[NI][U], w1[NI][U];
#pragma unroll
    for (int j = 0; j < NI; ++j) {
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int k = k0 + 32 * i + 8 * t;
        const bool in = k < k_end;  // K % 8 == 0: the whole unit
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        w0[j][i] = in ? moe_lds16(a[j] + 64 * i) : z;
        w1[j][i] = in ? moe_lds16(a[j] + 64 * i + 8 * pitch) : z;
        if constexpr (!MOE_TMA_XPIPE) load_x(j, k, xa[j][i], xb[j][i]);
      }
    }
    float4 na[NI][U], nb[NI][U];  // MOE_TMA_XPIPE: the next batch's, in flight during the mmas
    if constexpr (MOE_TMA_XPIPE) load_batch_x(k0 + 32 * U, na, nb);
#pragma unroll
    for (int i = 0; i < U; ++i) {
      if (k0 + 32 * i >= k_end) break;
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        if constexpr (XB) {
          const unsigned xh[4] = {__float_as_uint(xa[j][i].x), __float_as_uint(xa[j][i].y),
                                  __float_as_uint(xa[j][i].z), __float_as_uint(xa[j][i].w)};
          mma_step_bf16x8(c[j], w0[j][i], w1[j][i], xh);
        } else {
          const float xv[8] = {xa[j][i].x, xa[j][i].y, xa[j][i].z, xa[j][i].w,
                               xb[j][i].x, xb[j][i].y, xb[j][i].z, xb[j][i].w};
          mma_step_x8(c[j], w0[j][i], w1[j][i], xv);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      a[j] += 64 * U;
      if constexpr (MOE_TMA_XPIPE) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
          xa[j][i] = na[j][i];
          xb[j][i] = nb[j][i];
        }
      }
    }
  }
}

// XR = 1 (moe.py: one x row for every pair, x_by_pair = 0, and at most MOE_TMA_XR_STEPS 32-k
// steps per consumer warp): each consumer lane loads its x values of its K range once, right
// after pdl_wait, splits them into bf16 hi + lo words in registers and feeds every item from
// them (moe_tma_consume_xr): no global x loads per item, the same fragments and mma order.
#define MOE_TMA_XR_STEPS 8

// moe_tma_consume with x held split in registers (XR = 1): xh[st] / xl[st] = split x[k_begin
// + 32 st + 8 t .. + 7] (zeros where that unit is past k_end), steps in ascending order, the
// items' chains interleaved: per item exactly moe_tma_consume's fragments and mma order. XB: x
// was bf16 (xh its bits, xl unused): the hi products only, as moe_tma_consume<*, *, 1>.
template <int NI, int XB = 0>
__device__ __forceinline__ void moe_tma_consume_xr(
    unsigned a_0, unsigned a_1, int pitch, const unsigned (&xh)[MOE_TMA_XR_STEPS][4],
    const unsigned (&xl)[MOE_TMA_XR_STEPS][4], int k_begin, int k_end, int t, float (&c)[2][4]) {
  constexpr int U = MOE_TMA_U;
  static_assert(MOE_TMA_XR_STEPS % U == 0, "whole batches of steps");
  const unsigned a[2] = {a_0, a_1};
#pragma unroll
  for (int s0 = 0; s0 < MOE_TMA_XR_STEPS; s0 += U) {
    if (k_begin + 32 * s0 >= k_end) break;
    uint4 w0[NI][U], w1[NI][U];
#pragma unroll
    for (int j = 0; j < NI; ++j) {
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const bool in = k_begin + 32 * (s0 + i) + 8 * t < k_end;
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        w0[j][i] = in ? moe_lds16(a[j] + 64 * (s0 + i)) : z;
        w1[j][i] = in ? moe_lds16(a[j] + 64 * (s0 + i) + 8 * pitch) : z;
      }
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
      if (k_begin + 32 * (s0 + i) >= k_end) break;
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        if constexpr (XB)
          mma_step_bf16x8(c[j], w0[j][i], w1[j][i], xh[s0 + i]);
        else
          mma_step_split8(c[j], w0[j][i], w1[j][i], xh[s0 + i], xl[s0 + i]);
      }
    }
  }
}

#if BULK_COPY_OK
// moe_tma_gate_up_kernel's dynamic shared memory: the ring's barriers, the consumers' partials
// (two items, double-buffered) and the ring of stages of 16 rows `pitch` bytes apart.
struct MoeTmaRing {
  mbar_t* full;
  mbar_t* empty;
  MmaPartials<8>* red;
  char* ring;
  int pitch, stage_bytes;
};

__device__ __forceinline__ MoeTmaRing moe_tma_ring(int sk) {
  MoeTmaRing r;
  char* const smem = reinterpret_cast<char*>(moe_rows_smem);
  r.full = reinterpret_cast<mbar_t*>(smem);
  r.empty = r.full + MOE_TMA_MAX_STAGES;
  r.red = reinterpret_cast<MmaPartials<8>*>(smem + MOE_TMA_BAR_BYTES);
  r.ring = smem + MOE_TMA_BAR_BYTES + 4 * sizeof(MmaPartials<8>);
  r.pitch = moe_tma_pitch(sk);
  r.stage_bytes = 16 * r.pitch;
  return r;
}

// Thread 0: traps on a geometry the ring cannot take, then initialises the ring's barriers.
// The caller synchronises the block after.
__device__ __forceinline__ void moe_tma_ring_init(const MoeTmaRing& r, int cons, int sw,
                                                  int stages) {
  const int ns = cons / sw;
  unsigned dyn;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (stages < ns || stages > MOE_TMA_MAX_STAGES || stages % ns != 0 || cons > 8 ||
      ns * sw != cons ||
      (unsigned)(MOE_TMA_BAR_BYTES + 4 * sizeof(MmaPartials<8>)) +
              (unsigned)(stages * r.stage_bytes) > dyn ||
      (int)blockDim.x != 32 * (cons + 1))
    __trap();
  for (int i = 0; i < stages; ++i) {
    mbar_init(r.full + i, 1);
    mbar_init(r.empty + i, sw);
  }
}

// The producer warp of moe_tma_gate_up_kernel: streams the block's work items' stages into the
// ring (see the kernel).
__device__ __forceinline__ void moe_tma_produce(const MoeGemvParams& p, const MoeTmaRing& R,
                                                int sk, int ns, int stages, int items,
                                                int tiles, int lane) {
  const int G = gridDim.x;
  const unsigned long long policy = l2_evict_first_policy();
  const int r = lane & 15;  // this lane's tile row
  unsigned q = 0;           // the block's stage sequence number
  for (int item = blockIdx.x; item < items; item += G) {
    const int grp = item / tiles, m0 = (item - grp * tiles) * 8;
    const int e = p.group_expert[grp];
    const bool bad = e < 0 || e >= p.experts;
    const int live = bad ? 0 : min(8, p.m - m0);  // copied gate (= up) rows
    const bool row_ok = lane < 16 && (r & 7) < live;
    const i64 row = r < 8 ? m0 + r : p.up_offset + m0 + r - 8;
    const bf16raw* src =
        static_cast<const bf16raw*>(p.w) + (i64)(bad ? 0 : e) * p.w_es + row * p.w_rs;
    for (int s = 0; s < ns; ++s) {
      const unsigned bytes = 2u * (unsigned)min(sk, p.k - s * sk);
      const unsigned slot = q % (unsigned)stages, use = q / (unsigned)stages;
      if (lane == 0) {
        mbar_wait(R.empty + slot, (use & 1u) ^ 1u);
        mbar_arrive_expect_tx(R.full + slot, bytes * 2u * (unsigned)live);
      }
      __syncwarp();
      if (row_ok)
        bulk_copy_g2s(R.ring + slot * R.stage_bytes + r * R.pitch, src + (i64)s * sk, bytes,
                      R.full + slot, policy);
      ++q;
    }
  }
}

// The consumer warps of moe_tma_gate_up_kernel (warp = split): every work item of the block,
// act = silu(gate) * up into p.out (see the kernel). XB: p.x holds bf16 bits.
template <int XR, int XB = 0>
__device__ __forceinline__ void moe_tma_consume_items(const MoeGemvParams& p,
                                                      const MoeTmaRing& R, int sk, int sw,
                                                      int stages, int pairs, int items,
                                                      int tiles, int warp, int lane) {
  const int G = gridDim.x;
  const int cons = p.splits, ns = cons / sw;
  const int pitch = R.pitch, stage_bytes = R.stage_bytes;
  MmaPartials<8>* red = R.red;
  const int g = lane >> 2, t = lane & 3;
  const int s = warp / sw;  // this warp's stage of every item
  int k_begin, k_end;
  mma_warp_k_range(p.k, cons, warp, k_begin, k_end);
  // this lane's 16 bytes of A row g at its first step (row g + 8: + 8 pitch)
  const unsigned a0 =
      smem_addr(R.ring) + (unsigned)(g * pitch + 2 * (k_begin - s * sk) + 16 * t);
  // two items at a time (items i and i + G of this block) when the ring holds two items and
  // `pairs` is set: their mma chains are independent, so they overlap; each item's arithmetic
  // is that of one item alone. (A ring of one item cannot hold both: the producer would wait
  // for the slot the consumers release only after the second item.)
  const int per = pairs && stages >= 2 * ns ? 2 : 1;
  unsigned xh[MOE_TMA_XR_STEPS][4], xl[MOE_TMA_XR_STEPS][4];  // XR = 1 only (xl: not XB)
  if constexpr (XR && XB) {  // the bf16 bits are the hi words already
#pragma unroll
    for (int st = 0; st < MOE_TMA_XR_STEPS; ++st) {
      const int k = k_begin + 32 * st + 8 * t;
      const uint4 q = k < k_end ? __ldg(reinterpret_cast<const uint4*>(
                                      reinterpret_cast<const bf16raw*>(p.x) + k))
                                : make_uint4(0u, 0u, 0u, 0u);
      xh[st][0] = q.x;
      xh[st][1] = q.y;
      xh[st][2] = q.z;
      xh[st][3] = q.w;
    }
  } else if constexpr (XR) {  // all loads issued before any is split
    float4 xa[MOE_TMA_XR_STEPS], xb[MOE_TMA_XR_STEPS];
#pragma unroll
    for (int st = 0; st < MOE_TMA_XR_STEPS; ++st) {
      const int k = k_begin + 32 * st + 8 * t;
      const bool in = k < k_end;
      const float4 zf = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      xa[st] = in ? __ldg(reinterpret_cast<const float4*>(p.x + k)) : zf;
      xb[st] = in ? __ldg(reinterpret_cast<const float4*>(p.x + k + 4)) : zf;
    }
#pragma unroll
    for (int st = 0; st < MOE_TMA_XR_STEPS; ++st) {
      split_bf16x2(xa[st].x, xa[st].y, xh[st][0], xl[st][0]);
      split_bf16x2(xa[st].z, xa[st].w, xh[st][1], xl[st][1]);
      split_bf16x2(xb[st].x, xb[st].y, xh[st][2], xl[st][2]);
      split_bf16x2(xb[st].z, xb[st].w, xh[st][3], xl[st][3]);
    }
  }
  unsigned q = (unsigned)s;  // the block's stage sequence number of this warp's stage
  int parity = 0;
  for (int item = blockIdx.x; item < items; item += per * G) {
    const int n_it = min(per, (items - 1 - item) / G + 1);  // items of this round (1 or 2)
    MoeTmaItem it[2];
    unsigned slot[2];
    float c[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // (the second item's state repeats the first's when alone)
      it[j] = moe_tma_item<XR, XB>(p, j < n_it ? item + j * G : item, tiles, g);
      const unsigned qj = q + (unsigned)(j * ns);
      slot[j] = qj % (unsigned)stages;
      c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
      if (j < n_it) mbar_wait(R.full + slot[j], (qj / (unsigned)stages) & 1u);
    }
    if constexpr (XR) {
      if (n_it == 2)
        moe_tma_consume_xr<2, XB>(a0 + slot[0] * stage_bytes, a0 + slot[1] * stage_bytes, pitch,
                                  xh, xl, k_begin, k_end, t, c);
      else
        moe_tma_consume_xr<1, XB>(a0 + slot[0] * stage_bytes, 0u, pitch, xh, xl, k_begin, k_end,
                                  t, c);
    } else if (n_it == 2) {
      moe_tma_consume<2, false, XB>(a0 + slot[0] * stage_bytes, a0 + slot[1] * stage_bytes,
                                    pitch, it[0].xp, it[1].xp, k_begin, k_end, t, c);
    } else {
      moe_tma_consume<1, false, XB>(a0 + slot[0] * stage_bytes, 0u, pitch, it[0].xp, nullptr,
                                    k_begin, k_end, t, c);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (j < n_it) {
        if (lane == 0) mbar_arrive(R.empty + slot[j]);
        mma_store_partials(red[2 * parity + j], warp, g, t, c[j]);
      }
    }
    q += (unsigned)(n_it * ns);
    asm volatile("bar.sync 1, %0;" ::"r"(32 * cons) : "memory");
    for (int idx = threadIdx.x; idx < 64 * n_it; idx += 32 * cons) {
      const int j = idx >> 6, rr = (idx >> 3) & 7, n = idx & 7;
      const MoeTmaItem ij = j ? it[1] : it[0];  // no dynamic index (local memory)
      const int pn = ij.gp[n];
      if (ij.m0 + rr >= p.m || pn < 0) continue;
      float v = mma_reduce_partials<1>(red[2 * parity + j], cons, rr, n);
      if (ij.e < 0 || ij.e >= p.experts) v = NINFER_NAN;
      moe_store_out(p, pn, ij.m0 + rr, v);
    }
    parity ^= 1;
  }
}
#endif

template <int XR, int XB>
__global__ void __launch_bounds__(32 * (8 + 1), 1) moe_tma_gate_up_kernel(const MoeGemvParams p,
                                                                          int sk, int sw,
                                                                          int stages,
                                                                          int pairs) {
#if BULK_COPY_OK
  const TimelineMarks marks;  // (phase marks: timeline build only; thread 0 is a consumer)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cons = p.splits, ns = cons / sw;  // consumer warps, stages per item
  const MoeTmaRing ring = moe_tma_ring(sk);
  if (threadIdx.x == 0) {
    moe_tma_ring_init(ring, cons, sw, stages);
    mbar_init_fence();
  }
  __syncthreads();
  // the group tables, x and act belong to the previous kernels of the step (PDL); its
  // successor waits for this whole grid, so it may launch now
  pdl_wait();
  pdl_launch_dependents();
  timeline_mark(0);
  const int tiles = (p.m + 7) >> 3;
  const int items = *p.num_groups * tiles;
  if (warp == cons) {  // producer
    moe_tma_produce(p, ring, sk, ns, stages, items, tiles, lane);
    return;
  }
  moe_tma_consume_items<XR, XB>(p, ring, sk, sw, stages, pairs, items, tiles, warp, lane);
  timeline_mark(1);  // thread 0: its last item's outputs stored
#else
  __trap();
#endif
}

// ---- moe_tma_experts_kernel: both expert stages and the combine in one persistent launch ----
// (moe.py PERSIST, NINFER_MOE_PERSIST: opt-in; measured slower than the two launches, see
// docs/performance.md.) moe_tma_gate_up_kernel's grid (one persistent block per SM) and ring
// first run that kernel's gate_up + SwiGLU stage into act (the same producer and consumers,
// the same bits). Block b owns output columns [16 b, 16 b + 16) (moe_fused_down_kernel's block
// b): once its producer has issued the block's gate_up items it goes on bulk-copying into the
// ring's next stages the 16 rows of the folded shared down matrix (sd, where set; one stage)
// and then those rows of every group's expert down matrix (the down tiles: `gps` groups side by
// side per stage, row r of group j at byte 2 dn.k j of the stage's row r). A slot is refilled
// only after its consumers released it, so these copies stream while the block's last items
// compute. After its items the consumer warps compute the shared tile as linear_tma_kernel
// does (tma_gemv_warps_c: bitwise `linear`), and read the tables the down stage and the
// combine need into shared memory. A grid barrier (every block is resident: the grid is at most
// one block per SM and the next kernel may launch only after it) makes every block's act
// visible; the block copies all act rows into the ring stage after the down tiles (cp.async:
// one round trip), then teams of dn.splits consumer warps compute two groups' 16-row down tiles
// at a time (moe_tma_consume<2>), the split sum per (row, pair) as moe_fused_down_kernel (NaN
// for a bad expert), and the block combines its columns as that kernel does: bitwise its `out`.
// Ring: every slot's uses before the shared and down tiles were filled and consumed by the time
// their waiters wait (the consumers' last named barrier; the grid barrier), so those parity
// waits are exact although the waiters are not the warps that waited on those slots before.
// Dynamic shared memory: moe_tma_gate_up_kernel's (moe.py persist_plan: its ring must hold the
// shared tile, the down tiles of MOE_EXPERTS_GROUPS groups and their act rows).
#define MOE_EXPERTS_GROUPS 8  // moe_tma_experts_kernel: groups whose down tiles it stages
#define MOE_EXPERTS_TEAMS 4   // its down teams (one MmaPartials<8> each; named barriers 2..5)

// The combine's operands of the kernels that end in the fused down stage (moe_down_tables,
// moe_down_combine).
struct MoeCombine {
  const float* w;       // routing weights [N, top_k], rows w_rs apart
  const int* ids;       // routing ids [N, top_k], contiguous
  const float* shared;  // the gated shared expert's output [N, H] or null, rows shared_rs apart
  const float* gate;    // its gate logit, rows gate_rs apart
  float* out;           // [N, H], rows out_rs apart
  i64 w_rs, shared_rs, gate_rs, out_rs;
};
static_assert(sizeof(MoeCombine) == 72, "mirrored in moe.py");

struct MoeTmaExpertsParams {
  MoeGemvParams gu;  // the gate_up stage (moe_tma_gate_up_kernel's p; out = act)
  MoeGemvParams dn;  // the down stage (moe_fused_down_kernel's p: x = act by pair, k % 32 == 0)
  MoeSharedDown sd;  // the folded shared down (moe_fused_down_kernel's sd; w null: none)
  MoeCombine c;
  unsigned long long* barrier;  // the grid barrier's word (moe_grid_barrier; zero before first use)
  int n_rows, sk, sw, stages, pairs, pad;
};
static_assert(sizeof(MoeTmaExpertsParams) == 376, "mirrored in moe.py");

// Every block of the grid (all co-resident) meets here: writes before it by any thread of any
// block are visible to reads after it. `word`: arrivals (low 32 bits) and generation (high):
// a block arrives with one atomic; the last arrival's second atomic sets the arrivals back to
// 0 and moves the generation on, which the others wait for (any grid size, any number of uses).
__device__ __forceinline__ void moe_grid_barrier(unsigned long long* word) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long old = atomicAdd(word, 1ull);
    if ((unsigned)old == gridDim.x - 1) {
      atomicAdd(word, (1ull << 32) - gridDim.x);
    } else {
      const unsigned gen = (unsigned)(old >> 32);
      while ((unsigned)(*reinterpret_cast<volatile unsigned long long*>(word) >> 32) == gen)
        __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

#if BULK_COPY_OK
// Where tile j of a ring stage of moe_tma_stage_tiles lies: 16 rows `pitch` bytes apart from
// byte offset(j) of the stage. Tiles whose rows are contiguous in global memory (row stride =
// the row) are one bulk copy each (rows row_bytes apart, tiles one after another); others one
// copy per row (rows the ring's pitch apart, tiles side by side). Both fit the stage where
// (j + 1) row_bytes <= the ring's pitch.
struct MoeTileLayout {
  bool whole;
  int pitch, row_bytes;
  __device__ __forceinline__ int offset(int j) const {
    return whole ? j * 16 * row_bytes : j * row_bytes;
  }
};
__device__ __forceinline__ MoeTileLayout moe_tile_layout(i64 rs, int row_bytes, int ring_pitch) {
  const bool whole = 2 * rs == row_bytes;
  return MoeTileLayout{whole, whole ? row_bytes : ring_pitch, row_bytes};
}

// Lanes of one warp: `live` rows of row_bytes from src (rows rs elements apart) to dst (rows
// pitch bytes apart) on `full`: one copy by lane 0 where the rows are contiguous at both ends,
// else one per row (lanes 0..15). The caller counted the bytes on `full` before.
__device__ __forceinline__ void moe_copy_tile(char* dst, int pitch, const bf16raw* src, i64 rs,
                                              int live, unsigned row_bytes, mbar_t* full,
                                              unsigned long long policy, int lane) {
  if (2 * rs == (i64)row_bytes && pitch == (int)row_bytes) {
    if (lane == 0 && live > 0) bulk_copy_g2s(dst, src, row_bytes * (unsigned)live, full, policy);
  } else if (lane < live) {
    bulk_copy_g2s(dst + lane * pitch, src + (i64)lane * rs, row_bytes, full, policy);
  }
}

// The producer of moe_tma_experts_kernel: ring stage q (lane 0 waits for its slot) holds `ng`
// tiles of `live` rows (layout L), tile j's row r (< live) from src[j] + r rs (a null src is
// not copied; moe_copy_tile).
__device__ __forceinline__ void moe_tma_stage_tiles(const MoeTmaRing& R, int stages, unsigned q,
                                                    const bf16raw* const (&src)[MOE_EXPERTS_GROUPS],
                                                    int ng, i64 rs, int live,
                                                    const MoeTileLayout& L, int lane) {
  const unsigned slot = q % (unsigned)stages, use = q / (unsigned)stages;
  const unsigned row_bytes = (unsigned)L.row_bytes;
  if (lane == 0) {
    unsigned total = 0;
    for (int j = 0; j < ng; ++j) total += src[j] ? row_bytes * (unsigned)live : 0u;
    mbar_wait(R.empty + slot, (use & 1u) ^ 1u);
    mbar_arrive_expect_tx(R.full + slot, total);
  }
  __syncwarp();
  const unsigned long long policy = l2_evict_first_policy();
  char* const stage = R.ring + slot * R.stage_bytes;
  for (int j = 0; j < ng; ++j)
    if (src[j])
      moe_copy_tile(stage + L.offset(j), L.pitch, src[j], rs, live, row_bytes, R.full + slot,
                    policy, lane);
}

// Its down tiles from ring stage q0 on: the block's 16 rows of group grp's expert down matrix
// (none for a bad expert), `gps` groups per stage.
__device__ __forceinline__ void moe_tma_produce_down(const MoeGemvParams& d, const MoeTmaRing& R,
                                                     int stages, unsigned q0, int groups,
                                                     int gps, int lane) {
  const int m0 = blockIdx.x * 16, live = max(0, min(16, d.m - m0));
  for (int g0 = 0; g0 < groups; g0 += gps) {
    const bf16raw* src[MOE_EXPERTS_GROUPS];
    const int ng = min(gps, groups - g0);
    for (int j = 0; j < ng; ++j) {
      const int e = d.group_expert[g0 + j];
      src[j] = e >= 0 && e < d.experts ? static_cast<const bf16raw*>(d.w) + (i64)e * d.w_es +
                                             (i64)m0 * d.w_rs
                                       : nullptr;
    }
    moe_tma_stage_tiles(R, stages, q0 + (unsigned)(g0 / gps), src, ng, d.w_rs, live,
                        moe_tile_layout(d.w_rs, 2 * d.k, R.pitch), lane);
  }
}
#endif

#if BULK_COPY_OK
// ---- The fused down stage from shared memory: moe_tma_experts_kernel's and moe_tma_down_kernel's
// block (output columns [m0, m0 + 16)), bitwise moe_fused_down_kernel's ----

// The block's small tables: its down groups' pair tables and experts, the combine's order
// (pair and weight of row n's rank-th expert), sigmoid of the shared gate per row, and the
// stage's results (y per pair, the folded shared down per row).
struct MoeDownBlock {
  float y[MOE_EXPERTS_GROUPS * 16];   // [pair][r] (pairs <= MOE_EXPERTS_GROUPS)
  float ys[MOE_EXPERTS_GROUPS * 16];  // the folded shared down: [n][r]
  int pair[MOE_EXPERTS_GROUPS];       // [n][rank]: the pair of row n's rank-th expert
  float cw[MOE_EXPERTS_GROUPS];       // its weight
  float gate[MOE_EXPERTS_GROUPS];     // [n]: sigmoid(gate[n])
  int gp[MOE_EXPERTS_GROUPS * MOE_GROUP];
  int ge[MOE_EXPERTS_GROUPS];
};

// The block's threads read those tables (earlier kernels' outputs) into b; the caller
// synchronises the block before they are read.
__device__ __forceinline__ void moe_down_tables(const MoeGemvParams& d, const MoeCombine& c,
                                                int n_rows, int down_groups, MoeDownBlock& b) {
  const int top_k = d.top_k, n_pairs = n_rows * top_k;
  for (int qq = threadIdx.x; qq < n_pairs; qq += blockDim.x) {  // the combine's order
    const int n = qq / top_k, k = qq - n * top_k, id = c.ids[qq];
    int rank = 0;
    for (int k2 = 0; k2 < top_k; ++k2) rank += c.ids[n * top_k + k2] < id;
    b.pair[n * top_k + rank] = qq;
    b.cw[n * top_k + rank] = c.w[n * c.w_rs + k];
  }
  for (int i = threadIdx.x; i < down_groups * MOE_GROUP; i += blockDim.x) b.gp[i] = d.group_pairs[i];
  for (int i = threadIdx.x; i < down_groups; i += blockDim.x) b.ge[i] = d.group_expert[i];
  if (c.gate)
    for (int n = threadIdx.x; n < n_rows; n += blockDim.x)
      b.gate[n] = sigmoid_f(c.gate[n * c.gate_rs]);
}

// linear(sd.x, sd.w)'s 16-row tile at `a` (rows a_pitch bytes apart), as linear_tma_kernel sums
// it, into b.ys by warps 0..cons-1 (two of its consumer warps each: sd.cons <= 2 cons), which
// meet at named barrier 1 (32 cons threads) before writing `red` and before reducing it.
__device__ __forceinline__ void moe_shared_tile(const MoeSharedDown& sd, int n_rows, int m0,
                                                const char* a, int a_pitch,
                                                MmaPartials<16>& red, MoeDownBlock& b, int cons,
                                                int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
  // x rows past N read row N - 1 (their outputs are not stored)
  tma_gemv_warps_c<2>(a, a_pitch, sd.x + (i64)min(g, n_rows - 1) * sd.x_rs, sd.k, sd.sk,
                      sd.cons, warp, cons, lane, c);
  asm volatile("bar.sync 1, %0;" ::"r"(32 * cons) : "memory");  // red's earlier readers done
#pragma unroll
  for (int v = 0; v < 2; ++v)
    if (warp + v * cons < sd.cons) mma_store_partials(red, warp + v * cons, g, t, c[v]);
  asm volatile("bar.sync 1, %0;" ::"r"(32 * cons) : "memory");
  for (int idx = threadIdx.x; idx < 16 * 8; idx += 32 * cons) {
    const int r = idx >> 3, n = idx & 7;
    if (m0 + r < sd.m && n < n_rows) b.ys[n * 16 + r] = mma_reduce_partials<0>(red, sd.cons, r, n);
  }
}

// The block's threads copy the n_pairs act rows (f32, d.x by pair) into xs, x_pitch floats
// apart (16 bytes of padding: the 8 rows a quarter warp reads fall in distinct banks): one
// round trip through the L2 (cp.async.cg: act may have been written by other blocks of this
// launch); the block is synchronised after.
__device__ __forceinline__ void moe_stage_act(const MoeGemvParams& d, int n_pairs, float* xs,
                                              int x_pitch) {
  const int units = d.k >> 2;  // 16-byte units of an act row
  const unsigned xs_s = smem_addr(xs);
  for (int u = threadIdx.x; u < n_pairs * units; u += blockDim.x) {
    const int pr = u / units, c = u - pr * units;
    cp_async_16(xs_s + 4 * (pr * x_pitch + 4 * c), d.x + (i64)pr * d.x_rs + 4 * c);
  }
  cp_async_wait_all();
  __syncthreads();
}

// The down tiles of groups 0..down_groups-1 into b.y: teams of d.splits warps among warps
// 0..cons-1 (at most MOE_EXPERTS_TEAMS; team i meets at named barrier 2 + i and sums into
// red[i]); a team takes two groups at a time (grp, grp + slots) where their partials fit its
// MmaPartials<8> (splits [0, d.splits) and [d.splits, 2 d.splits)): their mma chains
// interleave, each group's arithmetic that of one group alone (moe_tma_consume: the
// fragments and order of moe_fused_down_kernel's tiles). tile.wait(grp) waits for group grp's
// 16 rows, tile.addr(grp) is their shared address (rows tile.pitch bytes apart); act rows at
// xs, x_pitch floats apart. The caller synchronises the block after.
template <class Tiles>
__device__ __forceinline__ void moe_down_teams(const MoeGemvParams& d, int down_groups, int m0,
                                               const Tiles& tile, const float* xs, int x_pitch,
                                               MmaPartials<8>* red, MoeDownBlock& b, int cons,
                                               int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int slots = min(MOE_EXPERTS_TEAMS, cons / d.splits);
  const int per = 2 * d.splits <= 8 ? 2 : 1;
  const int team = warp / d.splits, split = warp - team * d.splits;
  if (warp >= cons || team >= slots) return;
  int k_begin, k_end;
  mma_warp_k_range(d.k, d.splits, split, k_begin, k_end);
  const int tt = threadIdx.x - team * 32 * d.splits;
  for (int grp = team; grp < down_groups; grp += per * slots) {
    const int n_g = grp + slots < down_groups && per == 2 ? 2 : 1;
    unsigned a[2];
    const float* xp[2];
    float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int gj = j < n_g ? grp + j * slots : grp;
      // pair slot g's act row; an empty slot reads slot 0's (it only feeds its own column)
      const int pr = b.gp[gj * MOE_GROUP + g];
      const int p0 = b.gp[gj * MOE_GROUP];
      xp[j] = xs + (pr >= 0 ? pr : p0) * x_pitch;
      if (j < n_g) tile.wait(gj);
      a[j] = tile.addr(gj) + (unsigned)(g * tile.pitch + 2 * k_begin + 16 * t);
    }
    if (grp == 0) timeline_mark(3);  // (thread 0) the first down tiles have landed
    if (n_g == 2)
      moe_tma_consume<2, true>(a[0], a[1], tile.pitch, xp[0], xp[1], k_begin, k_end, t, c);
    else
      moe_tma_consume<1, true>(a[0], 0u, tile.pitch, xp[0], nullptr, k_begin, k_end, t, c);
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (j < n_g) mma_store_partials(red[team], j * d.splits + split, g, t, c[j]);
    asm volatile("bar.sync %0, %1;" ::"r"(2 + team), "r"(32 * d.splits) : "memory");
    for (int idx = tt; idx < 16 * 8 * n_g; idx += 32 * d.splits) {
      const int j = idx >> 7, r = (idx >> 3) & 15, n = idx & 7, gj = grp + j * slots;
      const int pn = b.gp[gj * MOE_GROUP + n];
      if (m0 + r >= d.m || pn < 0) continue;
      float v = 0.0f;  // mma_reduce_partials<0>'s sum over the splits in order
      for (int w = 0; w < d.splits; ++w) v += red[team][j * d.splits + w][r][n];
      const int e = b.ge[gj];
      if (e < 0 || e >= d.experts) v = NINFER_NAN;
      b.y[pn * 16 + r] = v;
    }
    asm volatile("bar.sync %0, %1;" ::"r"(2 + team), "r"(32 * d.splits) : "memory");
  }
}

// The combine of the block's columns (moe_fused_down_kernel's): c.out[n][m0 + r] = the routing
// weights' sum of the row's experts' y in ascending expert order, + sigmoid(gate) times the
// folded shared down (fold) or c.shared.
__device__ __forceinline__ void moe_down_combine(const MoeDownBlock& b, const MoeCombine& c,
                                                 int n_rows, int top_k, int m0, int m,
                                                 bool fold) {
  for (int idx = threadIdx.x; idx < n_rows * 16; idx += blockDim.x) {
    const int n = idx >> 4, r = idx & 15, j = m0 + r;
    if (j >= m) continue;
    float acc = 0.0f;
    for (int i = 0; i < top_k; ++i) acc += b.cw[n * top_k + i] * b.y[b.pair[n * top_k + i] * 16 + r];
    if (fold)
      acc = acc + b.gate[n] * b.ys[n * 16 + r];
    else if (c.shared)
      acc = acc + b.gate[n] * c.shared[n * c.shared_rs + j];
    c.out[n * c.out_rs + j] = acc;
  }
}

// moe_tma_experts_kernel's down tiles: in the ring stages from q_down on, `gps` per stage
// (layout `layout`; `base`: the ring's shared address).
struct MoeRingTiles {
  mbar_t* full;
  unsigned base, q_down;
  MoeTileLayout layout;
  int gps, stages, stage_bytes, pitch;
  __device__ __forceinline__ void wait(int grp) const {
    const unsigned qd = q_down + (unsigned)(grp / gps);
    mbar_wait(full + qd % (unsigned)stages, (qd / (unsigned)stages) & 1u);
  }
  __device__ __forceinline__ unsigned addr(int grp) const {
    const unsigned qd = q_down + (unsigned)(grp / gps);
    return base + (unsigned)((qd % (unsigned)stages) * stage_bytes + layout.offset(grp % gps));
  }
};
#endif

template <int XR>
__global__ void __launch_bounds__(32 * (8 + 1), 1)
    moe_tma_experts_kernel(const __grid_constant__ MoeTmaExpertsParams q) {
#if BULK_COPY_OK
  __shared__ MoeDownBlock b;
  const TimelineMarks marks;  // (phase marks: timeline build only; thread 0 is a consumer)
  const MoeGemvParams& p = q.gu;
  const MoeGemvParams& d = q.dn;
  const MoeSharedDown& sd = q.sd;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cons = p.splits, ns = cons / q.sw;
  const MoeTmaRing ring = moe_tma_ring(q.sk);
  const int gps = min(MOE_EXPERTS_GROUPS, ring.pitch / (2 * d.k));  // down tiles per stage
  const int top_k = d.top_k, n_pairs = q.n_rows * top_k;
  const bool fold = sd.w != nullptr;
  if (threadIdx.x == 0) {
    moe_tma_ring_init(ring, cons, q.sw, q.stages);
    if (d.splits > cons || n_pairs > MOE_EXPERTS_GROUPS || (int)gridDim.x * 16 < d.m ||
        d.k % 32 != 0 || gps < 1 ||
        (MOE_EXPERTS_GROUPS + gps - 1) / gps + (fold ? 2 : 1) > q.stages ||
        n_pairs * (d.k + 4) * 4 > ring.stage_bytes ||
        (fold && (sd.m != d.m || sd.cons > 2 * cons || 2 * sd.k > ring.pitch ||
                  sd.cons > MOE_SHARED_MAX_CONS)))
      __trap();
    mbar_init_fence();
  }
  __syncthreads();
  // the routing, the group tables, x, shared and gate belong to earlier kernels of the step;
  // the next kernel may launch only once every block is resident (after the grid barrier)
  pdl_wait();
  timeline_mark(0);
  const int tiles_m = (p.m + 7) >> 3;
  const int groups = *p.num_groups;
  const int items = groups * tiles_m;
  const int my_items =
      items > (int)blockIdx.x ? (items - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  const int m0 = blockIdx.x * 16;
  const bool owns = m0 < d.m;  // the block owns output columns (down tiles, combine)
  // the ring stages after the block's gate_up items: the shared down tile (fold), then the
  // down tiles, then (a slot of its own) act
  const unsigned q_shared = (unsigned)(my_items * ns);
  const unsigned q_down = q_shared + (fold ? 1u : 0u);
  const int down_groups = owns ? min(groups, MOE_EXPERTS_GROUPS) : 0;
  const unsigned q_act = q_down + (unsigned)((down_groups + gps - 1) / gps);
  const int x_pitch = d.k + 4;
  if (warp == cons) {  // producer: the gate_up items, then the shared and down tiles
    moe_tma_produce(p, ring, q.sk, ns, q.stages, items, tiles_m, lane);
    if (fold && owns) {
      const bf16raw* src[MOE_EXPERTS_GROUPS] = {sd.w + (i64)m0 * sd.w_rs};
      moe_tma_stage_tiles(ring, q.stages, q_shared, src, 1, sd.w_rs, min(16, sd.m - m0),
                          moe_tile_layout(sd.w_rs, 2 * sd.k, ring.pitch), lane);
    }
    moe_tma_produce_down(d, ring, q.stages, q_down, down_groups, gps, lane);
  } else {
    moe_tma_consume_items<XR>(p, ring, q.sk, q.sw, q.stages, q.pairs, items, tiles_m, warp,
                              lane);
  }
  timeline_mark(1);
  if (fold && owns && warp < cons) {
    const unsigned slot = q_shared % (unsigned)q.stages;
    mbar_wait(ring.full + slot, (q_shared / (unsigned)q.stages) & 1u);
    // (red: the gate_up consumers' partials until their last item's named barrier 1)
    moe_shared_tile(sd, q.n_rows, m0, ring.ring + slot * ring.stage_bytes,
                    moe_tile_layout(sd.w_rs, 2 * sd.k, ring.pitch).pitch,
                    *reinterpret_cast<MmaPartials<16>*>(ring.red), b, cons, warp, lane);
    timeline_mark(5);
  }
  // what the down stage and the combine read of earlier kernels' tables, before the barrier
  moe_down_tables(d, q.c, q.n_rows, down_groups, b);
  moe_grid_barrier(q.barrier);  // every block's act is written and visible
  pdl_launch_dependents();
  timeline_mark(2);
  if (!owns) return;
  float* const xs =
      reinterpret_cast<float*>(ring.ring + (q_act % (unsigned)q.stages) * ring.stage_bytes);
  moe_stage_act(d, n_pairs, xs, x_pitch);
  timeline_mark(6);
  const MoeTileLayout dl = moe_tile_layout(d.w_rs, 2 * d.k, ring.pitch);
  const MoeRingTiles tiles{ring.full, smem_addr(ring.ring), q_down, dl, gps, q.stages,
                           ring.stage_bytes, dl.pitch};
  moe_down_teams(d, down_groups, m0, tiles, xs, x_pitch, ring.red, b, cons, warp, lane);
  __syncthreads();
  timeline_mark(4);
  moe_down_combine(b, q.c, q.n_rows, top_k, m0, d.m, fold);
#else
  __trap();
#endif
}

// ---- moe_tma_down_kernel: the fused down stage with every read but act before pdl_wait ----
// (moe.py TMA_DOWN, NINFER_MOE_TMA_DOWN: opt-in until measured.) Launched only right after
// moe_tma_gate_up_kernel, which waits before it lets this launch start: the group tables, the
// routing, the gate, `shared` and the folded shared act were written by earlier kernels and are
// complete when this kernel starts; only act is the previous kernel's. Block b owns output
// columns [16 b, 16 b + 16) (moe_fused_down_kernel's block b). Before pdl_wait, warp 0
// bulk-copies the block's 16 rows of the folded shared down matrix (constant; first) and of
// every group's expert down matrix into shared memory (rows 2 K bytes apart; one copy per tile
// where the rows are contiguous, else one per row; rows past M and a bad expert's rows are not
// copied), the block reads the tables (moe_down_tables) and computes the shared tile
// (moe_shared_tile). After it: act (moe_stage_act), the groups' tiles (moe_down_teams: teams
// of dn.splits warps, two groups at a time) and the combine (moe_down_combine): bitwise
// moe_fused_down_kernel's `out`, whose L2 prefetch and table reads after its wait this
// replaces by copies before the wait.
// MOE_TMA_DOWN_WARPS warps. Dynamic shared memory (moe.py tma_down_smem): the two mbarriers
// (MOE_TMA_DOWN_HEAD bytes), the teams' MOE_EXPERTS_TEAMS MmaPartials<8> (the shared tile's
// MmaPartials<16> over them, before the wait), MOE_EXPERTS_GROUPS tiles of 16 x 2 dn.k bytes,
// the shared tile (16 x 2 sd.k bytes, fold), then MOE_EXPERTS_GROUPS act rows of dn.k + 4
// floats.
#define MOE_TMA_DOWN_WARPS 8
#define MOE_TMA_DOWN_HEAD 128

struct MoeTmaDownParams {
  MoeGemvParams dn;  // moe_fused_down_kernel's p (x = act by pair, k % 32 == 0)
  MoeSharedDown sd;  // the folded shared down (moe_fused_down_kernel's sd; w null: none)
  MoeCombine c;
  int n_rows, pad;
};
static_assert(sizeof(MoeTmaDownParams) == 240, "mirrored in moe.py");

#if BULK_COPY_OK
// moe_tma_down_kernel's tiles: all on one mbarrier, group grp's at base + 16 grp pitch.
struct MoeFlatTiles {
  mbar_t* full;
  unsigned base;
  int pitch;
  __device__ __forceinline__ void wait(int) const { mbar_wait(full, 0u); }
  __device__ __forceinline__ unsigned addr(int grp) const {
    return base + (unsigned)(grp * 16 * pitch);
  }
};

#endif

__global__ void __launch_bounds__(32 * MOE_TMA_DOWN_WARPS, 1)
    moe_tma_down_kernel(const __grid_constant__ MoeTmaDownParams q) {
#if BULK_COPY_OK
  __shared__ MoeDownBlock b;
  const TimelineMarks marks;  // (phase marks: timeline build only)
  const MoeGemvParams& d = q.dn;
  const MoeSharedDown& sd = q.sd;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int top_k = d.top_k, n_pairs = q.n_rows * top_k;
  const bool fold = sd.w != nullptr;
  const int m0 = blockIdx.x * 16, live = max(0, min(16, d.m - m0));
  const unsigned tile_bytes = 16u * 2u * (unsigned)d.k;
  const unsigned shared_bytes = fold ? 16u * 2u * (unsigned)sd.k : 0u;
  const int x_pitch = d.k + 4;
  char* const smem = reinterpret_cast<char*>(moe_rows_smem);
  mbar_t* const full = reinterpret_cast<mbar_t*>(smem);  // the expert tiles
  mbar_t* const sfull = full + 1;                        // the shared tile
  MmaPartials<8>* const red = reinterpret_cast<MmaPartials<8>*>(smem + MOE_TMA_DOWN_HEAD);
  char* const tiles = smem + MOE_TMA_DOWN_HEAD + MOE_EXPERTS_TEAMS * sizeof(MmaPartials<8>);
  char* const stile = tiles + MOE_EXPERTS_GROUPS * tile_bytes;
  float* const xs = reinterpret_cast<float*>(stile + shared_bytes);
  if (threadIdx.x == 0) {
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (blockDim.x != 32 * MOE_TMA_DOWN_WARPS || d.splits > MOE_TMA_DOWN_WARPS ||
        n_pairs > MOE_EXPERTS_GROUPS || d.k % 32 != 0 ||
        (unsigned)((char*)(xs + MOE_EXPERTS_GROUPS * x_pitch) - smem) > dyn ||
        (fold && (sd.m != d.m || sd.k % 16 != 0 || sd.cons > MOE_SHARED_MAX_CONS)))
      __trap();
    mbar_init(full, 1);
    mbar_init(sfull, 1);
    mbar_init_fence();
  }
  __syncthreads();
  const int groups = *d.num_groups;
  const int down_groups = min(groups, MOE_EXPERTS_GROUPS);
  if (warp == 0) {  // the copies: the shared tile, then the experts' tiles
    const unsigned long long policy = l2_evict_first_policy();
    if (fold) {
      if (lane == 0) mbar_arrive_expect_tx(sfull, 2u * (unsigned)sd.k * (unsigned)live);
      __syncwarp();
      moe_copy_tile(stile, 2 * sd.k, sd.w + (i64)m0 * sd.w_rs, sd.w_rs, live,
                    2u * (unsigned)sd.k, sfull, policy, lane);
    }
    const int my_e = lane < down_groups ? d.group_expert[lane] : -1;  // lane j: group j's
    const unsigned ok = __ballot_sync(0xffffffffu, my_e >= 0 && my_e < d.experts);
    if (lane == 0) mbar_arrive_expect_tx(full, (unsigned)__popc(ok) * 2u * (unsigned)d.k * live);
    __syncwarp();
    for (int j = 0; j < down_groups; ++j) {
      const int ej = __shfl_sync(0xffffffffu, my_e, j);
      if ((ok >> j) & 1u)
        moe_copy_tile(tiles + j * tile_bytes, 2 * d.k,
                      static_cast<const bf16raw*>(d.w) + (i64)ej * d.w_es + (i64)m0 * d.w_rs,
                      d.w_rs, live, 2u * (unsigned)d.k, full, policy, lane);
    }
  }
  moe_down_tables(d, q.c, q.n_rows, down_groups, b);
  __syncthreads();
  if (fold) {
    mbar_wait(sfull, 0u);
    moe_shared_tile(sd, q.n_rows, m0, stile, 2 * sd.k,
                    *reinterpret_cast<MmaPartials<16>*>(red), b, MOE_TMA_DOWN_WARPS, warp, lane);
    timeline_mark(5);
  }
  pdl_wait();  // act: the previous kernel's
  pdl_launch_dependents();
  timeline_mark(0);
  moe_stage_act(d, n_pairs, xs, x_pitch);
  timeline_mark(1);
  moe_down_teams(d, down_groups, m0, MoeFlatTiles{full, smem_addr(tiles), 2 * d.k}, xs, x_pitch,
                 red, b, MOE_TMA_DOWN_WARPS, warp, lane);
  __syncthreads();
  timeline_mark(2);
  moe_down_combine(b, q.c, q.n_rows, top_k, m0, d.m, fold);
#else
  __trap();
#endif
}

template <typename OT>
__global__ void __launch_bounds__(256) moe_gather_kernel(const float* __restrict__ x, i64 x_rs,
                                                         int hidden, int top_k,
                                                         const int* __restrict__ pair_row,
                                                         OT* __restrict__ out) {
  const i64 pr = blockIdx.x;
  const i64 n = pr / top_k;
  OT* dst = out + (i64)pair_row[pr] * hidden;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = from_f32<OT>(x[n * x_rs + j]);
}

template <typename OT>
__global__ void __launch_bounds__(256) moe_swiglu_kernel(const float* __restrict__ gu, i64 rows,
                                                         int inter, OT* __restrict__ act) {
  const i64 total = rows * inter;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (i64)gridDim.x * blockDim.x) {
    const i64 r = i / inter, c = i % inter;
    const float g = gu[r * 2 * inter + c], u = gu[r * 2 * inter + inter + c];
    act[i] = from_f32<OT>(silu_f(g) * u);
  }
}

// out f32 [N, K] (contiguous) = the values of x's bf16 bits (rows x_rs apart): exact. The MoE
// stages that read an f32 x run on this copy of a bf16 x (moe.py _x_f32). Grid N, 256 threads.
__global__ void __launch_bounds__(256) moe_x_f32_kernel(const bf16raw* __restrict__ x, i64 x_rs,
                                                        int k, float* __restrict__ out) {
  const i64 n = blockIdx.x;
  for (int j = threadIdx.x; j < k; j += blockDim.x) out[n * k + j] = to_f32(x[n * x_rs + j]);
}
