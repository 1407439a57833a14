// ldmatrix.cuh: ldmatrix.x4 (four 8x8 b16 matrices from shared memory) for the tensor-core
// attention kernels (attention.cu, attention_prefill.cu). Lanes 8i..8i+7 give the row
// addresses (32-bit shared-window) of matrix i. Plain: register i of lane l receives matrix
// i's elements (row l/4, cols 2(l%4), 2(l%4)+1); trans: (rows 2(l%4), 2(l%4)+1, col l/4). The
// low half holds the lower index.
#pragma once

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
