"""Layer 3: backend-neutral op entry points. Contracts: docs/ops.md.

Each entry checks its operands (shapes, dtypes, strides, one backend) and calls the kernel of the
operands' backend: NumPy -> `ninfer.kernels_numba_cpu`, CuPy -> `ninfer.kernels_cuda`. Kernel
modules are imported on first call, so importing this package compiles nothing.

Families that read weights or KV pages have `supports(dtype) -> bool`. The functions
`embedding`, `linear` and `rope` shadow their same-named submodules as package attributes, so
reach those modules' other names with `from ninfer.ops.linear import supports`.
Float64 references of every op (tests only): `ninfer.ops.reference`.
"""
from ninfer.ops.attention import kv_write, paged_attention
from ninfer.ops.attn_fused import attn_prep, paged_prefill_attention
from ninfer.ops.elementwise import add_inplace, sigmoid_mul, sigmoid_scale_add, swiglu
from ninfer.ops.embedding import embedding
from ninfer.ops.gdn import gdn_conv, gdn_gates, gdn_recurrence
from ninfer.ops.gdn_fused import gdn_chunk_prefill, gdn_decode_fused
from ninfer.ops.linear import linear, linear_swiglu
from ninfer.ops.moe import (moe_block, moe_block_folds_norm, moe_block_folds_shared_down,
                             moe_experts, moe_reads_bf16_x, moe_route, moe_route_with_swiglu,
                             moe_route_with_swiglu_applies)
from ninfer.ops.norm import add_rms_norm, gated_rms_norm, l2norm_heads, rms_norm
from ninfer.ops.rope import rope
from ninfer.ops.sampling import sample

__all__ = [
    "add_inplace", "add_rms_norm", "attn_prep", "embedding", "gated_rms_norm", "gdn_chunk_prefill",
    "gdn_conv", "gdn_decode_fused", "gdn_gates", "gdn_recurrence", "kv_write",
    "paged_prefill_attention", "l2norm_heads", "linear", "linear_swiglu", "moe_block",
    "moe_experts", "moe_route", "paged_attention", "rms_norm", "rope", "sample", "sigmoid_mul",
    "sigmoid_scale_add", "swiglu", "moe_route_with_swiglu", "moe_route_with_swiglu_applies",
    "moe_block_folds_shared_down", "moe_reads_bf16_x", "moe_block_folds_norm",
]
