// linear.cu: out[N, M] = x[N, K] @ w[M, K]^T with fp32 accumulation.
//
// linear_gemv_kernel<WT, NT, R, ALIGNED> (decode / skinny GEMM; the only path usable inside a
// captured graph). Grid (ceil(M / R), ceil(N / NT)); block = `splits` warps (1..8), warp s
// reducing the s-th of `splits` equal ranges of K. Each block computes R output columns for NT
// activation rows; the split count is chosen from K alone and the per-element order is fixed
// (gemv.cuh), so results do not depend on N (batch invariance). R grows with NT so that an
// activation value loaded into a register feeds R FMAs (x traffic / weight traffic = 2*NT/R).
// ALIGNED=1 needs K % 8 == 0 and 16-byte aligned rows of w and x (16-byte vector loads);
// ALIGNED=0 reads the same 8-element units with scalar, bounds-checked loads (same order).
//
// linear_mma_kernel<SWIGLU> (bf16 weights, 16-byte aligned rows of w and x): the tensor-core variant of
// the same contract (mma_gemv.cuh: x split into bf16 hi + lo terms, f32 accumulation). Grid
// (ceil(M / 16), ceil(N / 8)); block = `splits` (1..16) warps, warp s reducing the s-th of `splits`
// ranges of K (whole 32-element steps, the split chosen from K alone); partials summed in split
// order. Each output element's arithmetic is independent of N (batch invariance). Streams the
// weights at the same rate for N = 1 and N = 8 (the f32 FMA kernel is issue-bound at N = 8).
//
// linear_mma_rows_kernel<SWIGLU, PERSIST> (NINFER_GEMV_ROWS=0 selects linear_mma_kernel):
// linear_mma_kernel with the weight tile read row-contiguously and staged through shared memory;
// bitwise the same results.
//
// linear_tma_kernel<SWIGLU, SK, CONS, XS, TG, IO> (the default on sm_90 for K % 16 == 0; see
// below): the weights streamed by bulk copies into a shared-memory ring; batch invariant, another
// k pairing than the two above. IO picks the element types of x and out (f32 or bf16 bits).
//
// The TMA kernel's norm-fold IO flags (TMA_IO_RESID_NORM, TMA_IO_ROW_NORM; linear.py
// SOURCE_FOLD, NINFER_NORM_FOLD) carry the Qwen RMSNorm between two GEMVs in their epilogues:
// the producer adds its result into the residual stream and writes bf16(r * (1 + w)) and its
// block's sum of r^2; the consumer divides its sums by sqrt(sum / D + eps). No norm launch.
//
// linear_tma_swiglu_route_kernel<SK, CONS, XS, J>: linear_tma_kernel<1, ...> on all blocks but
// the last, which runs the MoE routing (moe_route.cuh) on the router logits meanwhile (moe.py
// route_with_swiglu; see below).
//
// f32_to_bf16_kernel: x f32 [N, K] (rows strided) -> bf16 [N, K] contiguous, round to nearest
// even; feeds the cuBLAS bf16 prefill path (linear.py).
#include "bulk_copy.cuh"
#include "gemv.cuh"
#include "mma_gemv.cuh"
#include "moe_route.cuh"

struct GemvParams {
  const void* w;
  const float* x;
  float* out;
  i64 w_rs, x_rs, out_rs;
  int m, k, n, splits;
};
static_assert(sizeof(GemvParams) == 64, "GemvParams layout is mirrored in linear.py");

template <typename WT, int NT, int R, int ALIGNED>
__global__ void __launch_bounds__(256) linear_gemv_kernel(const GemvParams p) {
  __shared__ float red[8 * R * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int m0 = blockIdx.x * R;
  const int n0 = blockIdx.y * NT;
  const int units = gemv_units(p.k);
  const int per = (units + p.splits - 1) / p.splits;
  const int u_begin = min(units, warp * per);
  const int u_end = min(units, u_begin + per);
  const WT* wbase = static_cast<const WT*>(p.w);
  const WT* wrow[R];
  const float* xrow[NT];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = m0 + r < p.m ? wbase + (i64)(m0 + r) * p.w_rs : nullptr;
#pragma unroll
  for (int n = 0; n < NT; ++n) xrow[n] = n0 + n < p.n ? p.x + (i64)(n0 + n) * p.x_rs : nullptr;
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[r][n] = 0.0f;
  gemv_warp_accumulate<WT, NT, R, ALIGNED != 0>(wrow, xrow, p.k, u_begin, u_end, lane, acc);
  gemv_store_partials<R, NT>(acc, red);
  for (int t = threadIdx.x; t < R * NT; t += blockDim.x) {
    const int r = t / NT, n = t % NT;
    if (m0 + r < p.m && n0 + n < p.n)
      p.out[(i64)(n0 + n) * p.out_rs + m0 + r] = gemv_sum_splits<R, NT>(red, p.splits, r, n);
  }
}

#define MMA_U 4
// SWIGLU=1: w = [gate; up] ([2M, K], up rows start at M); out[n, m] = silu(gate_m . x_n) *
// (up_m . x_n). A warp's A tile is gate rows m0..m0+7 over up rows m0..m0+7 (8 outputs per
// block), so each value is computed exactly as by the SWIGLU=0 kernel.
template <int SWIGLU>
__global__ void __launch_bounds__(512) linear_mma_kernel(const GemvParams p) {
  __shared__ MmaPartials<16> red;  // [split][A row][n in tile]
  constexpr int TILE = SWIGLU ? 8 : 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * TILE, n0 = blockIdx.y * 8;
  int k_begin, k_end;
  mma_warp_k_range(p.k, p.splits, warp, k_begin, k_end);
  const bf16raw* w = static_cast<const bf16raw*>(p.w);
  const int r1 = SWIGLU ? m0 + g : m0 + g + 8;  // output row of A row g + 8
  const bf16raw* wrow0 = m0 + g < p.m ? w + (i64)(m0 + g) * p.w_rs : nullptr;
  const bf16raw* wrow1 = r1 < p.m ? w + (i64)(SWIGLU ? p.m + r1 : r1) * p.w_rs : nullptr;
  const float* xrow = n0 + g < p.n ? p.x + (i64)(n0 + g) * p.x_rs : nullptr;
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_gemv_accumulate<MMA_U>(wrow0, wrow1, xrow, k_begin, k_end, t, c);
  mma_store_partials(red, warp, g, t, c);
  __syncthreads();
  for (int idx = threadIdx.x; idx < TILE * 8; idx += blockDim.x) {
    const int r = idx >> 3, n = idx & 7;
    if (m0 + r < p.m && n0 + n < p.n) {
      p.out[(i64)(n0 + n) * p.out_rs + m0 + r] = mma_reduce_partials<SWIGLU>(red, p.splits, r, n);
    }
  }
}

// linear_mma_rows_kernel<SWIGLU>: linear_mma_kernel with the weight tile read row-contiguously
// (mma_gemv.cuh, "Row-contiguous staging": a half-warp load reads 256 contiguous bytes of one
// row instead of 64 bytes of each of 8 rows) and handed to the mmas through a 4 KiB per-warp
// shared buffer (stmatrix in, ldmatrix out). Same block, K split, A fragments, x values, mma
// order and reduction order as linear_mma_kernel, so the stored results are bitwise identical.
// Row tiles: block x walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... (gridDim.x = the tile
// count gives linear_mma_kernel's one tile per block; fewer blocks make it persistent). Per
// warp, the 8 x 16-byte global loads of the next batch (registers) are in flight while the
// current batch's fragments are read from the buffer and multiplied, across tile boundaries
// too (the next tile's first batch loads during the current tile's last one). Dynamic shared
// memory (linear.py mma_rows_smem): splits * 4 KiB of staging, then two MmaPartials<16> (the
// tiles alternate, so one barrier per tile suffices), + 256 B of alignment slack. 64 registers
// at 512 threads (2 blocks of 16 warps per SM). PERSIST: 0 one tile per block, 1 persistent.
extern __shared__ uint4 mma_rows_smem[];

template <int SWIGLU, int PERSIST>
__global__ void __launch_bounds__(512, 2) linear_mma_rows_kernel(const GemvParams p) {
  constexpr int TILE = SWIGLU ? 8 : 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, h = lane >> 4;
  const int n0 = blockIdx.y * 8;
  const int tiles = (p.m + TILE - 1) / TILE;
  int k_begin, k_end;
  mma_warp_k_range(p.k, p.splits, warp, k_begin, k_end);
  // tile row 2j + h (j = 0..7) holds output row m0 + 2j + h (SWIGLU: gate row m0 + 2j + h for
  // j < 4, up row M + m0 + 2(j - 4) + h for j >= 4), as A rows g / g + 8 of linear_mma_kernel;
  // rows past M are never read (bit j of `valid` clear: zeros)
  const int ku = 8 * (lane & 15);  // this lane's k offset in a batch (loads)
  const i64 rsb = 2 * p.w_rs, hib = (i64)(SWIGLU ? p.m : 8) * rsb;  // bytes
  // mma_rows_unit(tile): the first batch's unit of tile row h of tile `tile`; xp: x[row][k0 + 8t]
  // (an x row past N reads row N - 1 instead of zeros: it only feeds output columns >= N, which
  // are not stored). Both are recomputed from the parameters per tile (kept live across the K
  // loop, the 64-bit bases spilled at 64 registers).
  const int kofs = k_begin + ku;
  auto mma_rows_unit = [&](int tile_) {
    return reinterpret_cast<const char*>(static_cast<const bf16raw*>(p.w) +
                                         (i64)(tile_ * TILE + h) * p.w_rs + kofs);
  };
  // the buffers start at the first 256-byte boundary of the dynamic shared memory (the launcher
  // adds MMA_ROWS_ALIGN bytes), so the XOR-swizzled addresses stay inside each warp's buffer
  const unsigned s0 = (unsigned)__cvta_generic_to_shared(mma_rows_smem);
  const unsigned pad = (MMA_ROWS_ALIGN - (s0 & (MMA_ROWS_ALIGN - 1))) & (MMA_ROWS_ALIGN - 1);
  char* const base = reinterpret_cast<char*>(mma_rows_smem) + pad;
  const unsigned buf = s0 + pad + warp * (MMA_ROWS_UNITS * 16);
  const unsigned st = buf + mma_rows_store_offset(lane), ld = buf + mma_rows_frag_offset(lane);
  const int span = k_end - k_begin;
  // a batch holds a partial unit iff K % 8 != 0 and it reaches k_end (then k_end = K): whole-unit
  // batches are those with rem >= full
  const int full = (k_end & 7) != 0 ? MMA_ROWS_K : 1;
  int tile = blockIdx.x;
  unsigned valid = mma_rows_valid<SWIGLU>(tile * TILE, h, p.m);
  const char* wp = mma_rows_unit(tile);
  uint4 v[8];
  if (tile >= tiles) return;
  if (span >= full) mma_rows_load(wp, hib, rsb, valid, ku < span, v);
  int parity = 0;
  do {  // PERSIST = 0: one tile, no back edge
    const int next = PERSIST ? tile + gridDim.x : tiles;
    int xo = k_begin + 8 * t;
    asm volatile("mov.b32 %0, %0;" : "+r"(xo));  // per tile, not hoisted (see above)
    const float* xp = p.x + (i64)min(n0 + g, p.n - 1) * p.x_rs + xo;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int rem = span;  // k left from the batch's k0 (linear_mma_kernel's k0 < k_end)
    while (rem >= full) {
      __syncwarp();  // the previous batch's fragments are read
      mma_rows_store(st, buf, lane, v);
      __syncwarp();
      const int rn = rem - MMA_ROWS_K;
      // the next batch's loads (this tile's, else the next tile's first) stay in flight during
      // this batch's mmas
      const bool same = rn >= full;
      if (same || (rn <= 0 && next < tiles)) {
        mma_rows_load(same ? wp + 2 * MMA_ROWS_K : mma_rows_unit(next), hib, rsb,
                      same ? valid : mma_rows_valid<SWIGLU>(next * TILE, h, p.m),
                      ku < (same ? rn : span), v);
      }
      mma_rows_batch<0>(ld, xp, 8 * t, rem, c);
      wp += 2 * MMA_ROWS_K;
      xp += MMA_ROWS_K;
      rem = rn;
    }
    if (rem > 0) {  // the warp's last batch holds a partial unit (K % 8 != 0): read element-wise
      __syncwarp();
      mma_rows_store_partial(reinterpret_cast<bf16raw*>(base + warp * (MMA_ROWS_UNITS * 16)),
                             lane, wp, hib, rsb, valid, rem - ku);
      __syncwarp();
      // here full = MMA_ROWS_K, so span >= full means every lane's unit of the next tile's
      // first batch is whole
      if (next < tiles && span >= full)
        mma_rows_load(mma_rows_unit(next), hib, rsb,
                      mma_rows_valid<SWIGLU>(next * TILE, h, p.m), true, v);
      mma_rows_batch<1>(ld, xp, 8 * t, rem, c);
    }
    MmaPartials<16>& red = reinterpret_cast<MmaPartials<16>*>(
        base + p.splits * (MMA_ROWS_UNITS * 16))[parity];
    mma_store_partials(red, warp, g, t, c);
    __syncthreads();
    const int m0 = tile * TILE;
    for (int idx = threadIdx.x; idx < TILE * 8; idx += blockDim.x) {
      const int r = idx >> 3, n = idx & 7;
      if (m0 + r < p.m && n0 + n < p.n) {
        p.out[(i64)(n0 + n) * p.out_rs + m0 + r] = mma_reduce_partials<SWIGLU>(red, p.splits, r, n);
      }
    }
    valid = mma_rows_valid<SWIGLU>(next * TILE, h, p.m);
    wp = mma_rows_unit(next);
    tile = next;
    parity ^= 1;
  } while (PERSIST && tile < tiles);
}

// linear_tma_kernel<SWIGLU, SK, CONS, XS, TG, IO> (sm_90, K % 16 == 0, bf16 weights with 16-byte
// aligned rows, x rows 8-byte aligned; NINFER_GEMV_TMA): the tensor-core GEMV with the weights
// streamed by bulk copies (bulk_copy.cuh) into a ring of shared-memory stages, so the bytes in
// flight are bounded by the ring, not by registers. Block = CONS consumer warps + 1 producer warp,
// one block per SM (persistent: block b walks the row tiles b, b + gridDim.x, ...; gridDim.y =
// column tiles of 8 activation rows). A stage is the 16 A rows of a tile (as in linear_mma_kernel:
// SWIGLU = 8 gate rows over the 8 matching up rows) times SK k: one copy of up to 2 SK bytes per
// row (lanes 0..15 of the producer), rows tma_pitch(SK) bytes apart (16 bytes of padding: the 8 row
// addresses of an ldmatrix phase fall in distinct banks); the ring holds p.splits stages
// (2..TMA_MAX_STAGES; linear.py sizes it). Rows past M are not copied (their stale A rows only feed
// outputs that are not stored).
// Consumers: warp w multiplies k [s SK + w SK / CONS, + SK / CONS) of every stage s in k16 steps
// (ldmatrix.x4 gives the standard m16n8k16 A fragment: lane (g, t) holds rows g, g + 8 at
// k + 2t, k + 2t + 1 and k + 8 + 2t, k + 9 + 2t; x[row g][those k] split into bf16 hi + lo as in
// mma_gemv.cuh), accumulating over the stages in order; the tile's output is the warps' partials
// summed in warp order. Every output element's arithmetic is a function of K alone (batch
// invariant; not bitwise equal to linear_mma_kernel, whose k pairing differs). x rows past N read
// row N - 1 (outputs not stored). Launched with PDL allowed (NINFER_GEMV_PDL), the producer starts
// streaming weights before the previous kernel has finished. XS > 0 (K <= XS SK): each lane splits
// its x fragments of all XS stages once, into registers, and reuses them for every tile (no x reads
// per tile: at N = 8 they cost as much L2 traffic as the weights); the same values and mma order as
// XS = 0, so bitwise the same results.
// IO (bit flags): TMA_IO_X_BF16: x holds bf16 bits (2 bytes per element instead of 4: at N = 8
// every block reads all of x, which costs as much as the weights at small M), multiplied by one
// mma per k16 step; the same bits as an f32 x holding those values (its lo term is then 0, and
// adding exact zero products leaves every partial sum as it was). TMA_IO_OUT_BF16: out holds
// bf16 bits, the f32 result rounded to nearest even (the operand of a bf16-x GEMV after it).
// TMA_IO_RESID_NORM (with TMA_IO_X_BF16, SWIGLU = 0; the producer of an RMSNorm's input): the
// result v is not stored; instead r = f.res[n, m] + v is written back to f.res, out (bf16 bits)
// = bf16(r * f.gain[m]), and f.parts[n, blockIdx.x] = this block's sum of r^2 over its output
// rows (per thread in tile order, then lanes of equal n by the butterfly over lane bits 3, 4,
// then the warps in warp order: fixed by M and the grid, not by N).
// TMA_IO_ROW_NORM (with TMA_IO_X_BF16; CONS >= 8; the consumer: x = bf16(r * gain) from such a
// producer): row n's sums are divided by sqrt(S / f.dim + f.eps) before the SwiGLU / store, S =
// f.parts[n, 0 .. f.parts_n) summed lane-strided (lane l: j = l, l + 32, ... in order), then
// by warp_sum. So y = (W bf16(r * gain)) / rms(r) stands for W bf16(r / rms(r) * gain).
// TMA_IO_NORM_X (with TMA_IO_ROW_NORM; an MoE layer's router, NINFER_MOE_ROUTER_NORM): the
// block also finishes the norm for the MoE block's other readers: xn[n, k] = bf16(x[n, k] /
// the row's rms) for k in its chunk [b C, b C + C) of K, C = ceil(K / G) (elementwise: any
// grid gives the same bits); xn is passed in NormFoldParams.res / res_rs.
#define TMA_IO_X_BF16 1
#define TMA_IO_OUT_BF16 2
#define TMA_IO_RESID_NORM 4
#define TMA_IO_ROW_NORM 8
#define TMA_IO_NORM_X 16
#define TMA_IO_X_VEC 32  // x loaded 16 bytes per lane (tma_x_vec_load)
#define NORM_FOLD_MAX_PARTS 256  // parts_n per row (linear.py NORM_FOLD_MAX_PARTS)
// NORM_FOLD_PREFETCH (linear.py SOURCE_FOLD_PREFETCH, NINFER_NORM_FOLD_PREFETCH; default on):
// RESID loads the residual and gain elements of the block's first NORM_FOLD_PREFETCH tiles
// right after its PDL wait, so the epilogue adds without a dependent load (the same bits).
#ifndef NORM_FOLD_PREFETCH
#define NORM_FOLD_PREFETCH 0
#endif
#define TMA_MAX_STAGES 16
// dynamic shared memory: full[stages], empty[stages] barriers (256 bytes), two
// MmaPartials<CONS>, the ring (linear.py tma_smem mirrors this)
#define TMA_BAR_BYTES 256
__host__ __device__ constexpr int tma_pitch(int sk) { return 2 * sk + 16; }
extern __shared__ __align__(128) unsigned char tma_smem[];

// One k16 step: A fragment from the stage at shared address `a` (this lane's ldmatrix row)
// times x[row][k + 2t .. + 1], x[row][k + 8 + 2t .. + 1] as bf16x2 words: XW = 4, an f32 x
// split into bf16 hi + lo (mma_gemv.cuh split_bf16x2), xf = {hi(x0), hi(x1), lo(x0), lo(x1)},
// the hi product first; XW = 2, a bf16 x, xf = {x0, x1}.
template <int XW>
__device__ __forceinline__ void tma_step(unsigned a, const unsigned (&xf)[XW], float (&c)[4]) {
  static_assert(XW == 2 || XW == 4, "bf16x2 words per k16 step");
  uint4 f;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(f.x), "=r"(f.y), "=r"(f.z), "=r"(f.w) : "r"(a) : "memory");
  mma_bf16_16816(c, f.x, f.y, f.z, f.w, xf[0], xf[1]);
  if constexpr (XW == 4) mma_bf16_16816(c, f.x, f.y, f.z, f.w, xf[2], xf[3]);
}

// TG > 1 (XS = 0 only): a block walks its row tiles in groups of TG (tiles t0 + i gridDim.x,
// i < TG) in lockstep over the stages (ring order: stage s of each tile of the group, then
// stage s + 1), so each lane reads its x fragments of a stage once per group instead of once per
// tile: at N = 8 and K > 5 SK the per-tile x reads cost as much L2 traffic as the weights. Each
// tile's arithmetic (k split, stage order, partial sums) is unchanged, so every TG gives the
// same bits.
#if BULK_COPY_OK
// The norm-fold operands of linear_tma_kernel (TMA_IO_RESID_NORM / TMA_IO_ROW_NORM; unused
// otherwise).
struct NormFoldParams {
  float* res;          // RESID: the residual stream [N, M], rows res_rs apart, updated in place
  const float* gain;   // RESID: the norm's 1 + w [M] (f32)
  float* parts;        // RESID: writes [N, blockIdx.x], rows parts_rs apart; ROW: reads it
  i64 res_rs, parts_rs;
  int parts_n, dim;    // ROW: columns of parts to sum; the norm's width D
  float eps;
  int pad;
};
struct TmaParams {
  GemvParams g;
  NormFoldParams f;
};
static_assert(sizeof(TmaParams) == 120, "TmaParams layout is mirrored in linear.py");
// NORM_X (a ROW mode, never with RESID): res / res_rs hold x / rms's output, bf16 bits [N, K]

// TMA_IO_X_VEC (with TMA_IO_X_BF16; linear.py: NINFER_GEMV_X_VEC, calls of N > 1 rows whose x
// sits in registers, XS > 0; x read per stage, XS = 0: also NINFER_GEMV_X_VEC_STAGES): x is
// loaded 16 bytes per lane instead of 4, so each 32-byte sector of x is read by one load
// instruction instead of two (at N = 8 a block reads 64 KB of x after its PDL wait, before its
// first MMA). The quad of lanes (g, t = 0..3) loads its row's 64 k of the
// warp's stage as words [16 a + 4 t, +4) for a = 0, 1; two 4 x 4 transposes in the quad then
// give each lane its mma fragments. The same fragment values, so the same bits.
// v[r] = row t's element r of the quad's 4 x 4 matrix (row = lane t); afterwards v[r] = row r's
// element t. Each step trades the two elements whose index bit differs from t's with lane t ^ b.
__device__ __forceinline__ void quad_transpose4(unsigned (&v)[4], const int t) {
  const bool o = t & 1;
  unsigned a = o ? v[0] : v[1], b = o ? v[2] : v[3];
  a = __shfl_xor_sync(0xffffffffu, a, 1);
  b = __shfl_xor_sync(0xffffffffu, b, 1);
  if (o) { v[0] = a; v[2] = b; } else { v[1] = a; v[3] = b; }
  const bool h = t & 2;
  a = h ? v[0] : v[2];
  b = h ? v[1] : v[3];
  a = __shfl_xor_sync(0xffffffffu, a, 2);
  b = __shfl_xor_sync(0xffffffffu, b, 2);
  if (h) { v[0] = a; v[1] = b; } else { v[2] = a; v[3] = b; }
}

// 16-byte loads need x and its rows 16-byte aligned (block-uniform: the shuffles need the warp)
template <int WK>
__device__ __forceinline__ bool tma_x_vec_ok(const GemvParams& p) {
  return WK == 64 && (reinterpret_cast<unsigned long long>(p.x) & 15) == 0 && (p.x_rs & 7) == 0;
}

// This lane's two 16-byte words of row `row`'s k range s SK + warp WK: w[a] = bf16 words
// [16 a + 4 t, +4) of the quad's 32 (zero past K; WK = 64)
template <int SK, int WK>
__device__ __forceinline__ void tma_x_vec_fetch(const GemvParams& p, const int row, const int warp,
                                                const int t, const int s, uint4 (&w)[2]) {
  const uint4* q = reinterpret_cast<const uint4*>(
      reinterpret_cast<const bf16raw*>(p.x) + (i64)row * p.x_rs + warp * WK);
#pragma unroll
  for (int a = 0; a < 2; ++a) {  // k 32 a + 8 t: step 2 a + t / 2
    const bool in = s * SK + warp * WK + 16 * (2 * a + (t >> 1)) < p.k;
    w[a] = in ? __ldg(q + s * (SK / 8) + 4 * a + t) : make_uint4(0u, 0u, 0u, 0u);
  }
}

// xf[j][h] = bf16 words (8 j + 4 h + t) of the stage, as the 4-byte loads give them, from the
// quad's tma_x_vec_fetch words
__device__ __forceinline__ void tma_x_vec_frags(const uint4 (&w)[2], const int t,
                                                unsigned (&xf)[4][2]) {
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    unsigned v[4] = {w[a].x, w[a].y, w[a].z, w[a].w};
    quad_transpose4(v, t);  // v[u] = word 16 a + 4 u + t
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      xf[2 * a + b][0] = v[2 * b];
      xf[2 * a + b][1] = v[2 * b + 1];
    }
  }
}

// xf[s][j][h] = bf16 words (8 j + 4 h + t) of row `row`'s k range s SK + warp WK (zero past K),
// as the 4-byte loads give them, for every stage s < XN (all loads issued before any transpose).
// (Written out rather than through tma_x_vec_fetch / _frags: this form's SASS is the one measured
// on the H200; the helpers' order of selects compiles to other SASS.)
template <int SK, int WK, int XN>
__device__ __forceinline__ void tma_x_vec_load(const GemvParams& p, const int row, const int warp,
                                               const int t, unsigned (&xf)[XN][WK / 16][2]) {
  if constexpr (WK == 64) {
    const uint4* q = reinterpret_cast<const uint4*>(
        reinterpret_cast<const bf16raw*>(p.x) + (i64)row * p.x_rs + warp * WK);
    uint4 w[XN][2];
#pragma unroll
    for (int s = 0; s < XN; ++s)
#pragma unroll
      for (int a = 0; a < 2; ++a) {  // k 32 a + 8 t: step 2 a + t / 2
        const bool in = s * SK + warp * WK + 16 * (2 * a + (t >> 1)) < p.k;
        w[s][a] = in ? __ldg(q + s * (SK / 8) + 4 * a + t) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
    for (int s = 0; s < XN; ++s)
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        unsigned v[4] = {w[s][a].x, w[s][a].y, w[s][a].z, w[s][a].w};
        quad_transpose4(v, t);  // v[u] = word 16 a + 4 u + t
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          xf[s][2 * a + b][0] = v[2 * b];
          xf[s][2 * a + b][1] = v[2 * b + 1];
        }
      }
  }
}

// The body of linear_tma_kernel on G persistent row-tile blocks (blockIdx.x < G).
template <int SWIGLU, int SK, int CONS, int XS, int TG, int IO>
__device__ __forceinline__ void linear_tma_body(const GemvParams& p, const int G,
                                                const NormFoldParams& f) {
  constexpr int TILE = SWIGLU ? 8 : 16;
  constexpr int PITCH = tma_pitch(SK), STAGE = 16 * PITCH;
  constexpr int WK = SK / CONS;  // k per warp per stage
  static_assert(WK % 16 == 0 && 2 * TMA_MAX_STAGES * 8 <= TMA_BAR_BYTES, "geometry");
  static_assert(TG >= 1 && (XS == 0 || TG == 1), "tile groups read x per stage (XS = 0)");
  constexpr bool XB = (IO & TMA_IO_X_BF16) != 0;
  constexpr int XW = XB ? 2 : 4;  // bf16x2 words of x per k16 step (tma_step)
  constexpr bool RESID = (IO & TMA_IO_RESID_NORM) != 0, ROWN = (IO & TMA_IO_ROW_NORM) != 0;
  constexpr bool NORMX = (IO & TMA_IO_NORM_X) != 0, XV = (IO & TMA_IO_X_VEC) != 0;
  static_assert(!XV || (XB && WK == 64), "16-byte x loads: a bf16 x, 4 k16 steps per warp");
  static_assert(!NORMX || (ROWN && !SWIGLU), "x / rms: a row-norm linear");
  static_assert(!RESID || (XB && !SWIGLU && !ROWN), "the residual fold: a plain bf16-x GEMV");
  static_assert(!ROWN || (XB && CONS >= 8), "the row norm: a bf16 x, a warp per row");
  constexpr int PV = NORM_FOLD_MAX_PARTS / 32;
  const unsigned STAGES = (unsigned)p.splits;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  mbar_t* full = reinterpret_cast<mbar_t*>(tma_smem);
  mbar_t* empty = full + STAGES;
  MmaPartials<CONS>* red = reinterpret_cast<MmaPartials<CONS>*>(tma_smem + TMA_BAR_BYTES);
  unsigned char* ring = tma_smem + TMA_BAR_BYTES + 2 * sizeof(MmaPartials<CONS>);
  const int tiles = (p.m + TILE - 1) / TILE;
  const int stages = (p.k + SK - 1) / SK;
  const int n0 = blockIdx.y * 8;
  // PDL (linear.py GEMV_PDL): the next GEMV may start as soon as every block of this one runs;
  // it then streams its weights while this one finishes (its consumers wait below)
  pdl_launch_dependents();
  const TimelineMarks marks;  // (phase marks: timeline build only; thread 0 is a consumer)
  if (threadIdx.x == 0) {
    for (int i = 0; i < (int)STAGES; ++i) {
      mbar_init(full + i, 1);
      mbar_init(empty + i, CONS);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (warp == CONS) {  // producer
    const unsigned long long policy = l2_evict_first_policy();
    const bf16raw* w = static_cast<const bf16raw*>(p.w);
    const int r = lane & 15;  // this lane's stage row
    unsigned q = 0;           // the block's stage sequence number
    for (int t0 = blockIdx.x; t0 < tiles; t0 += TG * G) {
      const bf16raw* src[TG];
      unsigned tx[TG];   // bytes per k of the tile's stage (its live rows)
      bool row_ok[TG];
#pragma unroll
      for (int i = 0; i < TG; ++i) {
        const int m0 = (t0 + i * G) * TILE;
        const int live = max(0, min(TILE, p.m - m0));  // output rows of the tile inside M
        row_ok[i] = lane < 16 && (SWIGLU ? (r & 7) < live : r < live);
        const i64 row = SWIGLU ? (r < 8 ? m0 + r : p.m + m0 + r - 8) : m0 + r;
        src[i] = w + row * p.w_rs;
        tx[i] = (unsigned)(SWIGLU ? 2 * live : live);
      }
      for (int s = 0; s < stages; ++s) {
        const unsigned bytes = 2u * (unsigned)min(SK, p.k - s * SK);
#pragma unroll
        for (int i = 0; i < TG; ++i) {
          if (t0 + i * G >= tiles) break;
          const unsigned slot = q % STAGES, use = q / STAGES;
          if (lane == 0) {
            mbar_wait(empty + slot, (use & 1u) ^ 1u);
            mbar_arrive_expect_tx(full + slot, bytes * tx[i]);
          }
          __syncwarp();
          if (row_ok[i])
            bulk_copy_g2s(ring + slot * STAGE + r * PITCH, src[i] + s * SK, bytes, full + slot,
                          policy);
          ++q;
        }
      }
    }
    return;
  }
  // consumers: everything they read (x) or write (out) may belong to the previous kernel in the
  // stream, which may still run under PDL; the producer only reads weights and writes the ring
  pdl_wait();
  timeline_mark(0);
  // ROWN: warp w < 8 loads row n0 + w's parts now (summed at the first tile's epilogue, off
  // the path to the first MMA)
  float pv[ROWN ? PV : 1];
  __shared__ float fold_sm[ROWN ? 8 : (RESID ? CONS * 8 : 1)];
  if constexpr (ROWN) {
    const float* prow = f.parts + (i64)min(n0 + warp, p.n - 1) * f.parts_rs;
#pragma unroll
    for (int i = 0; i < PV; ++i)
      pv[i] = warp < 8 && lane + 32 * i < f.parts_n ? __ldcg(prow + lane + 32 * i) : 0.0f;
  }
  float ss = 0.0f;  // RESID: this thread's sum of r^2 (its column n = threadIdx.x & 7)
  // NORM_FOLD_PREFETCH: the residual / gain elements of this thread's (row rr, column n) of the
  // block's j-th tile (blockIdx.x + j G), j < PF (the epilogue's thread mapping: CONS >= 4)
  constexpr int PF = RESID ? NORM_FOLD_PREFETCH : 0;
  float r_pre[PF > 0 ? PF : 1], g_pre[PF > 0 ? PF : 1];
  if constexpr (PF > 0) {
    static_assert(32 * CONS >= (SWIGLU ? 8 : 16) * 8, "a thread per output of a tile");
    const int rr = threadIdx.x >> 3, n = threadIdx.x & 7;
#pragma unroll
    for (int j = 0; j < PF; ++j) {
      const int m = (blockIdx.x + j * G) * 16 + rr;
      const bool ok = threadIdx.x < 128 && m < p.m && n0 + n < p.n;
      r_pre[j] = ok ? f.res[(i64)(n0 + n) * f.res_rs + m] : 0.0f;
      g_pre[j] = ok ? f.gain[m] : 0.0f;
    }
  }
  const int g = lane >> 2, t = lane & 3;
  // this lane's x elements (f32, or bf16 bits when XB) at k = 2t + warp WK of its row
  const i64 xofs = (i64)min(n0 + g, p.n - 1) * p.x_rs + 2 * t + warp * WK;
  const float* xrow = p.x + xofs;
  const bf16raw* xrow_b = reinterpret_cast<const bf16raw*>(p.x) + xofs;
  // this lane's ldmatrix row: matrices 0..3 = (rows 0-7 | 8-15) x (k .. k+7 | k+8 .. k+15)
  const unsigned lofs = ((lane & 7) + 8 * ((lane >> 3) & 1)) * PITCH + 16 * (lane >> 4);
  const unsigned ring_s = smem_addr(ring) + lofs + 2 * warp * WK;
  constexpr int XN = XS > 0 ? XS : 1;
  unsigned xf[XN][WK / 16][XW];
  bool vec = false;  // XV: x aligned for the 16-byte loads
  if constexpr (XV) vec = tma_x_vec_ok<WK>(p);
  if constexpr (XS > 0 && XB) {
    if (vec) {
      tma_x_vec_load<SK, WK, XN>(p, min(n0 + g, p.n - 1), warp, t, xf);
    } else {
#pragma unroll
      for (int s = 0; s < XN; ++s)
#pragma unroll
        for (int j = 0; j < WK / 16; ++j) {
          const bool in = s * SK + warp * WK + 16 * j < p.k;
          const unsigned* src = reinterpret_cast<const unsigned*>(xrow_b + s * SK + 16 * j);
          xf[s][j][0] = in ? __ldg(src) : 0u;
          xf[s][j][1] = in ? __ldg(src + 4) : 0u;
        }
    }
  } else if constexpr (XS > 0) {
    // every x load is issued before any is used (predicated, no branches), then split
    float2 xv[XN][WK / 16][2];
#pragma unroll
    for (int s = 0; s < XN; ++s)
#pragma unroll
      for (int j = 0; j < WK / 16; ++j) {
        const bool in = s * SK + warp * WK + 16 * j < p.k;  // K % 16 == 0: the whole step
        const float2* src = reinterpret_cast<const float2*>(xrow + s * SK + 16 * j);
        xv[s][j][0] = in ? __ldg(src) : make_float2(0.0f, 0.0f);
        xv[s][j][1] = in ? __ldg(src + 4) : make_float2(0.0f, 0.0f);
      }
#pragma unroll
    for (int s = 0; s < XN; ++s)
#pragma unroll
      for (int j = 0; j < WK / 16; ++j) {
        split_bf16x2(xv[s][j][0].x, xv[s][j][0].y, xf[s][j][0], xf[s][j][XW - 2]);
        split_bf16x2(xv[s][j][1].x, xv[s][j][1].y, xf[s][j][1], xf[s][j][XW - 1]);
      }
  }
  unsigned q = 0;
  int parity = 0;
  for (int t0 = blockIdx.x; t0 < tiles; t0 += TG * G) {
    float c[TG][4];
#pragma unroll
    for (int i = 0; i < TG; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
    if (XS > 0) {
#pragma unroll
      for (int s = 0; s < XN; ++s) {
        if (s >= stages) break;
        const unsigned slot = (q + s) % STAGES;
        mbar_wait(full + slot, ((q + s) / STAGES) & 1u);
        const unsigned a = ring_s + slot * STAGE;
        const int steps = min(WK, p.k - s * SK - warp * WK) >> 4;  // <= 0: none
#pragma unroll
        for (int j = 0; j < WK / 16; ++j)
          if (j < steps) tma_step<XW>(a + 32 * j, xf[s][j], c[0]);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + slot);
      }
      q += stages;
    }
    for (int s = 0; s < (XS > 0 ? 0 : stages); ++s) {
      // this stage's x fragments, read (and split) once for the group's tiles
      const float* xk = xrow + s * SK;
      const int steps = min(WK, p.k - s * SK - warp * WK) >> 4;  // <= 0: none
      unsigned xs[WK / 16][XW];
      bool fetched = false;
      if constexpr (XV && XS == 0) {  // the stage's x by 16-byte loads (XW = 2)
        if (vec) {
          uint4 w[2];
          tma_x_vec_fetch<SK, WK>(p, min(n0 + g, p.n - 1), warp, t, s, w);
          tma_x_vec_frags(w, t, xs);
          fetched = true;
        }
      }
      if (!fetched) {
#pragma unroll
        for (int j = 0; j < WK / 16; ++j) {
          if (XB && j < steps) {
            const unsigned* src = reinterpret_cast<const unsigned*>(xrow_b + s * SK + 16 * j);
            xs[j][0] = __ldg(src);
            xs[j][1] = __ldg(src + 4);
          } else if (j < steps) {
            const float2 x0 = __ldg(reinterpret_cast<const float2*>(xk + 16 * j));
            const float2 x1 = __ldg(reinterpret_cast<const float2*>(xk + 16 * j + 8));
            split_bf16x2(x0.x, x0.y, xs[j][0], xs[j][XW - 2]);
            split_bf16x2(x1.x, x1.y, xs[j][1], xs[j][XW - 1]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < TG; ++i) {
        if (t0 + i * G >= tiles) break;
        const unsigned slot = q % STAGES;
        mbar_wait(full + slot, (q / STAGES) & 1u);
        const unsigned a = ring_s + slot * STAGE;
#pragma unroll
        for (int j = 0; j < WK / 16; ++j)
          if (j < steps) tma_step<XW>(a + 32 * j, xs[j], c[i]);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + slot);
        ++q;
      }
    }
#pragma unroll
    for (int i = 0; i < TG; ++i) {
      const int tile = t0 + i * G;
      if (tile >= tiles) break;
      if (ROWN && t0 == (int)blockIdx.x && i == 0 && warp < 8) {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < PV; ++j) sum += pv[j];
        sum = warp_sum(sum);
        if (lane == 0) fold_sm[warp] = sqrtf(sum / (float)f.dim + f.eps);
      }
      mma_store_partials(red[parity], warp, g, t, c[i]);
      asm volatile("bar.sync 1, %0;" ::"n"(32 * CONS) : "memory");
      if (t0 == (int)blockIdx.x && i == 0) timeline_mark(1);  // first tile: every warp's MMAs
      timeline_mark(2);  // (the last tile's overwrites it)
      const int m0 = tile * TILE;
      for (int idx = threadIdx.x; idx < TILE * 8; idx += 32 * CONS) {
        const int rr = idx >> 3, n = idx & 7;
        if (m0 + rr < p.m && n0 + n < p.n) {
          const i64 o = (i64)(n0 + n) * p.out_rs + m0 + rr;
          const float v = mma_reduce_partials<SWIGLU, CONS, ROWN>(
              red[parity], CONS, rr, n, ROWN ? fold_sm[n] : 1.0f);
          if constexpr (RESID && PF > 0) {
            float* rp = f.res + (i64)(n0 + n) * f.res_rs + m0 + rr;
            const int j = (tile - (int)blockIdx.x) / G;  // the tile's ordinal in this block
            float r0 = 0.0f, g0 = 0.0f;
            bool pre = false;
#pragma unroll
            for (int q = 0; q < PF; ++q)
              if (q == j) r0 = r_pre[q], g0 = g_pre[q], pre = true;
            const float r = (pre ? r0 : *rp) + v;
            *rp = r;
            reinterpret_cast<bf16raw*>(p.out)[o] = f32_to_bf16(r * (pre ? g0 : f.gain[m0 + rr]));
            ss = fmaf(r, r, ss);
          } else if constexpr (RESID) {  // (apart: the measured build's code, PTX unchanged)
            float* rp = f.res + (i64)(n0 + n) * f.res_rs + m0 + rr;
            const float r = *rp + v;
            *rp = r;
            reinterpret_cast<bf16raw*>(p.out)[o] = f32_to_bf16(r * f.gain[m0 + rr]);
            ss = fmaf(r, r, ss);
          } else if constexpr ((IO & TMA_IO_OUT_BF16) != 0) {
            reinterpret_cast<bf16raw*>(p.out)[o] = f32_to_bf16(v);
          } else {
            p.out[o] = v;
          }
        }
      }
      parity ^= 1;
    }
  }
  if constexpr (NORMX) {  // the block's chunk of x / rms (the denominators: first epilogue)
    const int chunk = (p.k + G - 1) / G, k0 = blockIdx.x * chunk;
    const int width = max(0, min(p.k, k0 + chunk) - k0), rows = min(8, p.n - n0);
    const bf16raw* xb = reinterpret_cast<const bf16raw*>(p.x);
    bf16raw* xn = reinterpret_cast<bf16raw*>(f.res);  // (NORM_X: the x / rms output)
    for (int idx = threadIdx.x; idx < rows * width; idx += 32 * CONS) {
      const int n = idx / width, k = k0 + idx - n * width;
      xn[(i64)(n0 + n) * f.res_rs + k] =
          f32_to_bf16(to_f32(xb[(i64)(n0 + n) * p.x_rs + k]) / fold_sm[n]);
    }
  }
  if constexpr (RESID) {  // the block's sum of r^2 per row (every thread holds one column n)
    ss += __shfl_xor_sync(0xffffffffu, ss, 8);
    ss += __shfl_xor_sync(0xffffffffu, ss, 16);
    if (lane < 8) fold_sm[warp * 8 + lane] = ss;
    asm volatile("bar.sync 1, %0;" ::"n"(32 * CONS) : "memory");
    if (threadIdx.x < 8 && n0 + (int)threadIdx.x < p.n) {
      float total = 0.0f;
      for (int w = 0; w < CONS; ++w) total += fold_sm[w * 8 + threadIdx.x];
      f.parts[(i64)(n0 + threadIdx.x) * f.parts_rs + blockIdx.x] = total;
    }
  }
  timeline_mark(3);  // thread 0: its output stores issued
}
#endif

template <int SWIGLU, int SK, int CONS, int XS, int TG, int IO>
__global__ void __launch_bounds__(32 * (CONS + 1), 1) linear_tma_kernel(const TmaParams p) {
#if BULK_COPY_OK
  linear_tma_body<SWIGLU, SK, CONS, XS, TG, IO>(p.g, gridDim.x, p.f);
#else
  __trap();
#endif
}

// The routing half of linear_tma_swiglu_route_kernel (moe.py route_with_swiglu).
struct TmaRouteParams {
  GemvParams gemv;      // the SwiGLU GEMV (linear_tma_kernel<1, ...>'s params)
  const float* logits;  // [N, >= experts], rows logits_rs apart (written by the kernel before)
  float* w_out;         // routing weights [N, top_k], rows w_out_rs apart
  int* ids_out;         // routing ids [N, top_k], contiguous
  int* group_expert;    // the grouping of ids_out (moe_group_block)
  int* group_pairs;
  int* num_groups;
  i64 logits_rs, w_out_rs;
  int experts, top_k, chunk, pad;
};
static_assert(sizeof(TmaRouteParams) == 144, "TmaRouteParams layout is mirrored in linear.py");

// linear_tma_swiglu_route_kernel<SK, CONS, XS, J, IO> (N <= 8: one column tile): blocks 0..G-1
// (G = gridDim.x - 1) run linear_tma_kernel<1, SK, CONS, XS, 1, IO> on q.gemv (the MoE layer's
// shared expert gate_up + SwiGLU; each tile computed exactly as that kernel computes it), and
// the last block runs moe_route_group_kernel<J> on q.logits (the router's output, complete at
// pdl_wait) with that kernel's warps (max(N, pairs / 32), rows w, w + warps, ...; the rest of
// the block exits), grouping synchronised by a named barrier; bitwise both kernels' outputs,
// in one launch. The routing's dependent chain then runs beside the GEMV instead of as a link
// of its own.
template <int SK, int CONS, int XS, int J, int IO>
__global__ void __launch_bounds__(32 * (CONS + 1), 1)
    linear_tma_swiglu_route_kernel(const __grid_constant__ TmaRouteParams q) {
#if BULK_COPY_OK
  const int G = gridDim.x - 1;
  if (blockIdx.x < G) {
    linear_tma_body<1, SK, CONS, XS, 1, IO>(q.gemv, G, NormFoldParams{});
    return;
  }
  pdl_launch_dependents();  // as the GEMV blocks do: the next kernel waits for this grid
  const int n_rows = q.gemv.n, n_pairs = n_rows * q.top_k;
  const int warps = max(n_rows, (n_pairs + 31) >> 5);  // <= CONS + 1 (linear.py)
  if ((int)threadIdx.x >= 32 * warps) return;
  pdl_wait();
  int* s_ids = reinterpret_cast<int*>(tma_smem);
  const int lane = threadIdx.x & 31;
  for (int n = threadIdx.x >> 5; n < n_rows; n += warps)
    moe_route_row<J>(q.logits + n * q.logits_rs, q.experts, q.top_k, lane,
                     q.w_out + n * q.w_out_rs, q.ids_out + n * q.top_k, s_ids + n * q.top_k);
  moe_group_sync<true>(32 * warps);  // the routed ids in s_ids
  moe_group_block<true>(s_ids, n_pairs, q.chunk, q.group_expert, q.group_pairs, q.num_groups,
                        32 * warps);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(256) f32_to_bf16_kernel(const float* __restrict__ x, i64 x_rs,
                                                          int n, int k, bf16raw* __restrict__ out) {
  // grid: (column blocks, row blocks); 4 elements per thread step with 16-byte loads and 8-byte
  // stores when K, the row stride and both bases allow it (the usual case), else one at a time
  const bool vec = (k % 4 == 0) && (x_rs % 4 == 0) && (((size_t)x & 15) == 0) &&
                   (((size_t)out & 7) == 0);
  const int step = gridDim.x * blockDim.x;
  for (int row = blockIdx.y; row < n; row += gridDim.y) {
    const float* xr = x + (i64)row * x_rs;
    bf16raw* orow = out + (i64)row * k;
    if (vec) {
      for (int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x); c < k; c += 4 * step) {
        const float4 v = *reinterpret_cast<const float4*>(xr + c);
        ushort4 o;
        o.x = f32_to_bf16(v.x);
        o.y = f32_to_bf16(v.y);
        o.z = f32_to_bf16(v.z);
        o.w = f32_to_bf16(v.w);
        *reinterpret_cast<ushort4*>(orow + c) = o;
      }
    } else {
      for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < k; c += step) {
        orow[c] = f32_to_bf16(xr[c]);
      }
    }
  }
}
