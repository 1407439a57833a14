// gdn_decode.cu: one fused kernel per GDN layer per decode step (one token per row),
// gdn_decode_fused_head2_kernel.
//
// For row n's token and value head h: 1. conv update + SiLU of the channels head h needs (q and
// k of key head kh = h / (Hv / Hk), v of head h) from the slot's conv state and the new qkv row;
// 2. L2 norm of q (times dk^-1/2) and k; 3. g = -exp(a_log) softplus(a + dt_bias), beta;
// 4. the delta-rule step on S[slot, h] (dk x dv); 5. the gated RMSNorm w * (o / rms(o)) * silu(z)
// into out[n, h].
//
// The dv columns of a head form DEC_GROUPS column groups of 32 (one column per lane). The delta
// rule is exact per column: with raw (unnormalized) conv outputs q, k, rq = dk^-1/2 / |q|,
// rk = 1 / |k|, d = exp(g) and the column sums K_j = sum_i k_i S_ij, Q_j = sum_i q_i S_ij,
//   kv_j = d rk K_j, delta_j = beta (v_j - kv_j), S'_ij = d S_ij + k_i (rk delta_j),
//   o_j = rq (d Q_j + (rk delta_j) (q . k)),
// so one reduction round gives K_j, Q_j, |q|^2, |k|^2 and q . k. Only the RMSNorm couples the
// columns of a head (through sum_j o_j^2).
//
// Grid (Hv, N): one block of 512 threads per head and row, at <= 64 registers (2 blocks per SM
// for kc <= 4). Warp w handles rows 8w..8w+7 of the state for all 4 column groups (one column per
// lane and group: 32 state values per thread). The loads of S are issued before pdl_wait (no
// kernel of the step before this one writes S or the slots) so they overlap the conv, norm and
// gate work. Threads 0-127 / 128-255 / 256-383: the conv of the q / k / v channels (one each);
// warps 12-15 (threads 384-511, no conv channel): the column sums, o_j and the output (details
// in the section below). Column sums over the 16 warps are added in warp order and the
// RMSNorm adds the 4 group sums in group order; no atomics in the arithmetic, so the results
// are deterministic and batch invariant.
// (Three other bitwise-equal kernels, thread-block clusters of 4 and 2 blocks per head and a
// one-block-per-head kernel at ~105 registers, were slower at every B on the H200 and were
// removed; see gdn_decode.py.)
//
// Conv state ownership: the v channel of column j of head h belongs to head h's block, which
// shifts it in place. The q/k channels of key head kh are read by the blocks of the Hv/Hk heads
// of the group, so the last of them to finish reading (counted on counters[n * Hk + kh], which it
// resets to 0 for the next launch) shifts them. counters must be zero before the first launch.
// PDL: slots, S and the weights are read before pdl_wait (and the conv-state lines prefetched to
// the L2); qkv, a, b, z, the conv state and the counters after it, and every write is after it.
// Weights (conv, a_log, dt_bias, norm) may each be f32 or bf16 (runtime flags, bit i = bf16).
// dk, dv <= 128, kc <= 8 (instances for kc <= 4 and kc <= 8).
#include "common.cuh"

struct DecodeParams {
  const float* qkv;
  const void* conv_w;
  float* conv_state;
  const float* a;
  const float* b;
  const void* a_log;
  const void* dt_bias;
  float* state;
  const int* slots;
  const float* z;
  const void* norm_w;
  float* out;
  int* counters;
  i64 qkv_rs, conv_w_rs, conv_ss, a_rs, b_rs, state_ss, z_rs, z_hs, out_rs, out_hs;
  int key_heads, value_heads, dk, dv, kc, channels;
  float eps, l2_eps, q_scale;
  int bf16_flags;  // bit 0 conv_w, 1 a_log, 2 dt_bias, 3 norm_w, 4 out (DEC_OUT_BF16)
};
static_assert(sizeof(DecodeParams) == 224, "DecodeParams layout is mirrored in gdn_decode.py");

__device__ __forceinline__ float load_any(const void* p, bool bf16, i64 i) {
  return bf16 ? to_f32(static_cast<const bf16raw*>(p)[i]) : static_cast<const float*>(p)[i];
}

#define DEC_OUT_BF16 16  // bf16_flags: out holds bf16 bits (the f32 value rounded to nearest even)
#define DEC_THREADS 512
#define DEC_WARPS 16
#define DEC_RPW 8     // state rows per warp (DEC_WARPS * DEC_RPW = 128 >= dk)
#define DEC_COLS 32   // columns per group (one per lane)
#define DEC_GROUPS 4  // column groups per head (DEC_GROUPS * DEC_COLS = 128 >= dv)

// ---- gdn_decode_fused_head2_kernel: one block per head at <= 64 registers (2 blocks of 512
// threads per SM for kc <= 4). Who does what:
// - the state (32 values per thread: 4 column groups x 8 rows) is loaded before pdl_wait; the
//   norm weights, z and o live only in the threads of warps 12-15 (thread 384 + j: column j),
//   which have no conv channel;
// - one reduction round for all 4 column groups: every warp stores its 8-row partial sums of
//   k_i S_ij and q_i S_ij for its 4 columns per lane (red_k / red_q [group][warp][lane]), then
//   warp 12 + g alone adds the 16 partials of group g in warp order, computes rk delta_j and o_j
//   and the group's sum of o_j^2, and shares rk delta_j (kd) and the sum (ssq); every thread
//   then updates its 32 state values. 3 block barriers after the conv;
// - the last-block flag of the conv-state counter is read only before the second barrier, so the
//   atomic's round trip overlaps the partial sums.
struct __align__(16) DecHeadShared {
  float qs[128], ks[128];                          // raw conv outputs of q and k (zero past dk)
  float vs[DEC_GROUPS * DEC_COLS];                 // v channels by column
  float red_k[DEC_GROUPS][DEC_WARPS][DEC_COLS];    // per group, per warp: sums of k_i S_ij
  float red_q[DEC_GROUPS][DEC_WARPS][DEC_COLS];    // ... of q_i S_ij
  float kd[DEC_GROUPS * DEC_COLS];                 // rk delta_j by column
  float nw[DEC_GROUPS * DEC_COLS];                 // norm weights by column
  float zv[DEC_GROUPS * DEC_COLS];                 // z by column
  float scal[4][3];                                // per warp 0..3: sum q^2, k^2, q k
  float ssq[DEC_GROUPS];                           // per column group: sum of o_j^2
  int last;                                        // this block shifts the q/k conv channels
};

#define DEC_OUT_T0 (DEC_THREADS - DEC_GROUPS * DEC_COLS)  // first thread of warps 12-15

// *p if i < dk and col < dv, else 0 (p is not read). The bounds are tested inside the asm: a
// plain conditional lets the compiler keep 32 predicates live (and spill them) across the loads.
__device__ __forceinline__ float ld_in_bounds(const float* p, int i, int dk, int col, int dv) {
  float v;
  asm volatile("{\n\t.reg .pred ok;\n\t"
      "setp.lt.s32 ok, %2, %3;\n\t"
      "setp.lt.and.s32 ok, %4, %5, ok;\n\t"
      "mov.b32 %0, 0;\n\t"
      "@ok ld.global.f32 %0, [%1];\n\t}"
      : "=f"(v)
      : "l"(p), "r"(i), "r"(dk), "r"(col), "r"(dv));
  return v;
}

// DEC_STATE_L2_LAST (NINFER_GDN_STATE_L2_LAST): the dk = dv = 128 state loads and stores carry
// an L2 evict-last policy, so that a layer's state (written this step, read the next) outlives
// the weights streamed in between (their copies are evict-first); the same values.
#ifdef DEC_STATE_L2_LAST
// (ptxas reports an 8-byte spill for the kc <= 4 instance at its 64-register budget)
__device__ __forceinline__ float dec_state_ld(const float* p) {
  float v;
  // (volatile: issued where written, before the kernel's PDL wait)
  asm volatile("{\n\t.reg .b64 pol;\n\t"
               "createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
               "ld.global.L2::cache_hint.f32 %0, [%1], pol;\n\t}"
               : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void dec_state_st(float* p, float v) {
  asm volatile("{\n\t.reg .b64 pol;\n\t"
               "createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
               "st.global.L2::cache_hint.f32 [%0], %1, pol;\n\t}"
               ::"l"(p), "f"(v) : "memory");
}
#define DEC_STATE_LD(ptr) dec_state_ld(ptr)
#define DEC_STATE_ST(ptr, v) dec_state_st(ptr, v)
#else
#define DEC_STATE_LD(ptr) (*(ptr))
#define DEC_STATE_ST(ptr, v) (*(ptr) = (v))
#endif

// The state loads of gdn_decode_head2_body: s[gi][r] = S[row0 + r][32 gi + lane] (0 outside
// dk x dv). At dk = dv = 128 (a uniform branch; the stores do the same) every address is one
// base plus an immediate offset (fewer registers than per-row pointers and bounds).
__device__ __forceinline__ void head2_load(float (&s)[DEC_GROUPS][DEC_RPW], const float* S,
                                           int row0, int lane, int dk, int dv) {
  if (dk == 128 && dv == 128) {
    const float* b = S + row0 * 128 + lane;
#pragma unroll
    for (int gi = 0; gi < DEC_GROUPS; ++gi)
#pragma unroll
      for (int r = 0; r < DEC_RPW; ++r) s[gi][r] = DEC_STATE_LD(b + r * 128 + gi * DEC_COLS);
  } else {
#pragma unroll
    for (int gi = 0; gi < DEC_GROUPS; ++gi) {
      const int col = gi * DEC_COLS + lane;
#pragma unroll
      for (int r = 0; r < DEC_RPW; ++r) {
        const int i = row0 + r;
        s[gi][r] = ld_in_bounds(S + (i64)i * dv + col, i, dk, col, dv);
      }
    }
  }
}

template <int MAXK>
__device__ __forceinline__ void gdn_decode_head2_body(const DecodeParams& p, DecHeadShared& sh) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int h = blockIdx.x;
  const i64 n = blockIdx.y;
  const int group = p.value_heads / p.key_heads;
  const int kh = h / group;
  const int keep = p.kc - 1;
  const int dk = p.dk, dv = p.dv;
  const bool ow = t >= DEC_OUT_T0;  // warps 12-15: reduction and output of column oc
  const int oc = t - DEC_OUT_T0;

  const TimelineMarks marks;  // (phase marks: timeline build only)
  // ---- before pdl_wait: slot, S, weights (no kernel of the step before writes them)
  // thread t: q channel t (t < 128), k channel t - 128 (t < 256), v channel of column t - 256
  // (t < 384); channel -1: none
  int c = -1;
  if (t < 256) {
    const int i = t & 127;
    if (i < dk) c = (t < 128 ? kh * dk : (p.key_heads + kh) * dk) + i;
  } else if (t < DEC_OUT_T0) {
    const int col = t - 256;
    if (col < dv) c = 2 * p.key_heads * dk + h * dv + col;
  }
  // the conv weights of channel c (t < 384) or the norm weight of column oc (t >= 384) go to
  // shared memory (each thread reads back its own), so that no weight register is held across
  // pdl_wait; loaded together with the slot, whose round trip the state loads wait for anyway
  const int slot = p.slots[n];
  __shared__ float cw2[MAXK + 1][DEC_OUT_T0];
  {
    float wv[MAXK + 1];
    const bool w_bf16 = p.bf16_flags & 1;
#pragma unroll
    for (int j = 0; j <= MAXK; ++j)
      wv[j] = (c >= 0 && j <= keep) ? load_any(p.conv_w, w_bf16, (i64)c * p.conv_w_rs + j)
                                    : 0.0f;
    if (ow && oc < dv) wv[0] = load_any(p.norm_w, p.bf16_flags & 8, oc);
    if (t < DEC_OUT_T0) {
#pragma unroll
      for (int j = 0; j <= MAXK; ++j) cw2[j][t] = wv[j];
    } else {
      sh.nw[oc] = wv[0];
    }
  }
  // the conv-state lines of this block's channels (written by this layer's previous step only)
  // head for the L2 now, one line per thread of warps 12-15 (those hold no conv channel): they
  // are read after pdl_wait, beside the new qkv row. oc = 16 r + 4 j + l: line l of channel
  // range r (q, k, v of this head) in window row j; threads 48, 49: a_log[h], dt_bias[h].
  if (ow) {
    const int r = oc >> 4, j = (oc >> 2) & 3, l = oc & 3;
    const int len = r == 2 ? dv : dk;
    const int c0 = r == 0 ? kh * dk : r == 1 ? (p.key_heads + kh) * dk
                                             : 2 * p.key_heads * dk + h * dv;
    if (r < 3 && j < keep && 32 * l < len)
      prefetch_l2(p.conv_state + (i64)slot * p.conv_ss + (i64)j * p.channels + c0 + 32 * l);
    // and the gate weights of head h (read after pdl_wait, beside a and b)
    if (oc == 48) prefetch_l2(static_cast<const char*>(p.a_log) + h * (p.bf16_flags & 2 ? 2 : 4));
    if (oc == 49)
      prefetch_l2(static_cast<const char*>(p.dt_bias) + h * (p.bf16_flags & 4 ? 2 : 4));
  }
  float* S = p.state + (i64)slot * p.state_ss + (i64)h * dk * dv;
  const int row0 = warp * DEC_RPW;
  float s[DEC_GROUPS][DEC_RPW];
  head2_load(s, S, row0, lane, dk, dv);

  pdl_wait();
  pdl_launch_dependents();
  timeline_mark(0);

  // ---- 3. gates (first: fewer registers live through the conv; a_log and dt_bias are loaded
  // here, beside a and b, rather than held across pdl_wait)
  const float a_log = load_any(p.a_log, p.bf16_flags & 2, h);
  const float dt_bias = load_any(p.dt_bias, p.bf16_flags & 4, h);
  const float av = p.a[n * p.a_rs + h] + dt_bias;
  const float bv = p.b[n * p.b_rs + h];
  const float g = -expf(a_log) * softplus_f(av);
  const float beta = sigmoid_f(bv);
  const float decay = expf(g);

  // ---- 1. conv (reads the old state of every needed channel)
  const float* xrow = p.qkv + n * p.qkv_rs;
  float* cst = p.conv_state + (i64)slot * p.conv_ss;
  float x = 0.0f, win[MAXK];
  if (c >= 0) x = xrow[c];
#pragma unroll
  for (int j = 0; j < MAXK; ++j)
    win[j] = (c >= 0 && j < keep) ? cst[(i64)j * p.channels + c] : 0.0f;
  if (ow) sh.zv[oc] = oc < dv ? p.z[n * p.z_rs + (i64)h * p.z_hs + oc] : 0.0f;
  {
    float acc = 0.0f, wl = 0.0f;  // wl: the tap on the new input (index keep)
#pragma unroll
    for (int j = 0; j <= MAXK; ++j) {
      const float wj = t < DEC_OUT_T0 ? cw2[j][t] : 0.0f;
      if (j < keep) acc = fmaf(wj, win[j], acc);
      if (j == keep) wl = wj;
    }
    acc = fmaf(wl, x, acc);
    const float u = c >= 0 ? silu_f(acc) : 0.0f;
    if (t < 128) sh.qs[t] = u;
    else if (t < 256) sh.ks[t - 128] = u;
    else if (t < DEC_OUT_T0) sh.vs[t - 256] = u;
  }
  timeline_mark(1);  // the inputs' round trip and the conv
  // conv state: the owner shifts a v channel now; the shifted q/k window goes to shared memory
  // for the last block of the key head
  __shared__ float qk_win2[MAXK][256];
#pragma unroll
  for (int j = 0; j < MAXK; ++j) {
    if (j < keep) {
      const float nv = j + 1 < keep ? win[j + 1] : x;
      if (t < 256) qk_win2[j][t] = nv;
      else if (c >= 0) cst[(i64)j * p.channels + c] = nv;
    }
  }
  __syncthreads();
  timeline_mark(2);
  int prev = 0;
  if (t == 0) {  // every thread's conv-state reads are done (their values were used above)
    // acq_rel at gpu scope: releases this block's reads (ordered before it by the barrier) to
    // the last block, and acquires the other blocks' for it; no full sequential-consistency
    // fence (membar.gl) on warp 0's path to the next barrier
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(prev) : "l"(p.counters + n * p.key_heads + kh) : "memory");
  }
  // ---- 2. norms of q and k
  if (t < 128) {
    const float qv = sh.qs[t], kv = sh.ks[t];
    const float sq = warp_sum(qv * qv), sk = warp_sum(kv * kv), sqk = warp_sum(qv * kv);
    if (lane == 0) {
      sh.scal[warp][0] = sq;
      sh.scal[warp][1] = sk;
      sh.scal[warp][2] = sqk;
    }
  }
  // ---- 4. delta rule: this warp's 8-row partial sums for the 4 column groups
  {
    float pk[DEC_GROUPS], pq[DEC_GROUPS];
#pragma unroll
    for (int gi = 0; gi < DEC_GROUPS; ++gi) pk[gi] = pq[gi] = 0.0f;
#pragma unroll
    for (int r = 0; r < DEC_RPW; ++r) {
      const float kr = sh.ks[row0 + r], qr = sh.qs[row0 + r];
#pragma unroll
      for (int gi = 0; gi < DEC_GROUPS; ++gi) {
        pk[gi] = fmaf(kr, s[gi][r], pk[gi]);
        pq[gi] = fmaf(qr, s[gi][r], pq[gi]);
      }
    }
#pragma unroll
    for (int gi = 0; gi < DEC_GROUPS; ++gi) {
      sh.red_k[gi][warp][lane] = pk[gi];
      sh.red_q[gi][warp][lane] = pq[gi];
    }
  }
  __syncthreads();
  timeline_mark(3);  // after the conv-state count (acq_rel) and the partial sums
  // warp 12 + gi: column sums of group gi (in warp order), rk delta_j, o_j, sum of o_j^2
  float o = 0.0f;
  if (ow) {
    const int gi = oc / DEC_COLS;
    float kc = 0.0f, qc = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) {
      kc += sh.red_k[gi][w][lane];
      qc += sh.red_q[gi][w][lane];
    }
    const float ssq_q = (sh.scal[0][0] + sh.scal[1][0]) + (sh.scal[2][0] + sh.scal[3][0]);
    const float ssq_k = (sh.scal[0][1] + sh.scal[1][1]) + (sh.scal[2][1] + sh.scal[3][1]);
    const float qk = (sh.scal[0][2] + sh.scal[1][2]) + (sh.scal[2][2] + sh.scal[3][2]);
    const float rq = p.q_scale / sqrtf(ssq_q + p.l2_eps);
    const float rk = 1.0f / sqrtf(ssq_k + p.l2_eps);
    const float v = sh.vs[oc];
    // explicit fmas (no contraction choices left to the compiler)
    const float kdelta = rk * (beta * fmaf(-decay, rk * kc, v));
    o = rq * fmaf(kdelta, qk, decay * qc);
    sh.kd[oc] = kdelta;
    const float part = warp_sum(oc < dv ? o * o : 0.0f);
    if (lane == 0) sh.ssq[gi] = part;
  }
  if (t == 0) sh.last = prev == group - 1;
  __syncthreads();
  timeline_mark(4);
  // ---- state update: S'_ij = d S_ij + k_i (rk delta_j)
  {
    const float4* k4 = reinterpret_cast<const float4*>(sh.ks + row0);
    float kr[DEC_RPW];
#pragma unroll
    for (int r4 = 0; r4 < DEC_RPW / 4; ++r4) {
      const float4 kk = k4[r4];
      kr[r4 * 4] = kk.x;
      kr[r4 * 4 + 1] = kk.y;
      kr[r4 * 4 + 2] = kk.z;
      kr[r4 * 4 + 3] = kk.w;
    }
    if (dk == 128 && dv == 128) {
      float* b = S + row0 * 128 + lane;
#pragma unroll
      for (int gi = 0; gi < DEC_GROUPS; ++gi) {
        const float kdelta = sh.kd[gi * DEC_COLS + lane];
#pragma unroll
        for (int r = 0; r < DEC_RPW; ++r)
          DEC_STATE_ST(b + r * 128 + gi * DEC_COLS, fmaf(kr[r], kdelta, decay * s[gi][r]));
      }
    } else {
#pragma unroll
      for (int gi = 0; gi < DEC_GROUPS; ++gi) {
        const int col = gi * DEC_COLS + lane;
        if (col < dv) {
          const float kdelta = sh.kd[col];
#pragma unroll
          for (int r = 0; r < DEC_RPW; ++r) {
            const int i = row0 + r;
            if (i < dk) S[(i64)i * dv + col] = fmaf(kr[r], kdelta, decay * s[gi][r]);
          }
        }
      }
    }
  }
  // ---- the last block of the key head shifts the q/k channels (all blocks have read them)
  if (sh.last) {  // uniform; written before the second barrier
    if (t == 0) p.counters[n * p.key_heads + kh] = 0;
    if (t < 256 && c >= 0) {
#pragma unroll
      for (int j = 0; j < MAXK; ++j)
        if (j < keep) cst[(i64)j * p.channels + c] = qk_win2[j][t];
    }
  }
  // ---- 5. gated RMSNorm over the dv outputs of head h (the group sums in group order)
  if (ow && oc < dv) {
    float total = sh.ssq[0];
#pragma unroll
    for (int r = 1; r < DEC_GROUPS; ++r) total += sh.ssq[r];
    const float denom = sqrtf(total / (float)dv + p.eps);
    const float y = sh.nw[oc] * (o / denom) * silu_f(sh.zv[oc]);
    const i64 at = n * p.out_rs + (i64)h * p.out_hs + oc;
    if (p.bf16_flags & DEC_OUT_BF16)
      reinterpret_cast<bf16raw*>(p.out)[at] = f32_to_bf16(y);
    else
      p.out[at] = y;
  }
  timeline_mark(5);  // thread 0: its state stores issued
}

// MAXK 3 (kc <= 4): 2 blocks of 512 threads per SM (<= 64 registers; nvcc sm_90: 64, no
// spills); MAXK 7: 1 block (111 registers).
template <int MAXK>
__global__ void __launch_bounds__(DEC_THREADS, MAXK <= 3 ? 2 : 1)
    gdn_decode_fused_head2_kernel(const DecodeParams p) {
  __shared__ DecHeadShared sh;
  gdn_decode_head2_body<MAXK>(p, sh);
}
