// bulk_copy.cuh: sm_90 bulk asynchronous copies (cp.async.bulk, the TMA engine's 1-D form)
// global -> shared, completed on shared-memory mbarriers.
//
// A producer thread waits until a ring slot is free (`mbar_wait(empty, parity)`), announces
// the bytes it will copy (`mbar_arrive_expect_tx(full, bytes)`) and issues the copies
// (`bulk_copy_g2s(..., full)`); the consumers wait for the phase of `full` (`mbar_wait`), read
// the slot and release it (`mbar_arrive(empty)`). A slot's n-th use (n = 0, 1, ...) waits on
// `full` with parity n & 1 and on `empty` with parity (n & 1) ^ 1 (a fresh barrier counts its
// phase "-1" as complete, so the first wait on `empty` returns at once). The copies need 16-byte
// aligned source and destination and a multiple of 16 bytes; they do not occupy registers, so
// the bytes in flight are bounded only by the ring.
// Everything here needs sm_90; callers guard their bodies with BULK_COPY_OK.
#pragma once
#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define BULK_COPY_OK 1
#else
#define BULK_COPY_OK 0
#endif

typedef unsigned long long mbar_t;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

#if BULK_COPY_OK
__device__ __forceinline__ void mbar_init(mbar_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Makes the initialized barriers visible to the async proxy (then __syncthreads).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(mbar_t* bar) {
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(mbar_t* bar, unsigned bytes) {
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(
          smem_addr(bar)),
      "r"(bytes)
      : "memory");
}

// Spins until the barrier's phase with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(mbar_t* bar, unsigned parity) {
  const unsigned a = smem_addr(bar);
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  } while (!done);
}

// An L2 policy that evicts the copied lines first (weights streamed once per step: they should
// not push the activations, KV pages and states out of L2).
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
  unsigned long long pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// `bytes` (multiple of 16) from global `src` to shared `dst` (both 16-byte aligned), counted on
// `bar`'s transaction count when they land.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes,
                                              mbar_t* bar, unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

// One box of a 4-d tensor map (`tmap`: the generic address of a CUtensorMap held in a
// __grid_constant__ kernel parameter) at coordinates (c0, c1, c2, c3) to shared `dst` (aligned
// as the map's swizzle needs: 1024 bytes for the 128-byte swizzle), counted on `bar`'s
// transaction count (the whole box's bytes) when it lands.
__device__ __forceinline__ void bulk_tensor_g2s_4d(void* dst, const void* tmap, int c0, int c1,
                                                   int c2, int c3, mbar_t* bar,
                                                   unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(smem_addr(dst)),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
#endif
