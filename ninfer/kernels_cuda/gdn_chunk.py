"""Launcher for gdn_chunk.cu: `gdn_chunk_prefill`, the chunkwise (WY/UT, chunk 64) delta rule.

Same operands and state update as `gdn.gdn_recurrence`; equal to it within fp32 rounding.
Three launches: chunk offsets, per-chunk local terms (parallel over all chunks), then the
state pass (sequential over each segment's chunks, parallel over heads and 32-column tiles of
the state). Matrix products use tensor cores in 3xTF32 (split hi/lo operands, fp32
accumulation: about fp32 accuracy); the state stays fp32. Intermediates live in a
`ChunkWorkspace`: pass one sized for the largest prefill (allocated per call when None). Chunks
start at each segment's first token, so splitting a prompt at multiples of 64 tokens reproduces
the unsplit result exactly.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import _gdn_operands as O
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

CHUNK = 64
DMAX = 128
SOURCE = KernelSource("gdn_chunk.cu", ("gdn_chunk_offsets_kernel", "gdn_chunk_local_kernel",
                                       "gdn_chunk_state_kernel"))
_PARAMS = C.struct(*[(f, "ptr") for f in (
    "q", "k", "v", "g", "beta", "state", "seg_starts", "seg_slots", "out", "chunk_offsets",
    "w_ws", "u_ws", "gam_ws", "p_ws")],
    *[(f, "i64") for f in ("q_rs", "q_hs", "k_rs", "k_hs", "v_rs", "v_hs", "g_rs", "beta_rs",
                           "out_rs", "out_hs", "state_ss")],
    ("key_heads", "i32"), ("value_heads", "i32"), ("dk", "i32"), ("dv", "i32"),
    ("num_segs", "i32"), ("max_chunks", "i32"), ("vec_qk", "i32"), ("pad_", "i32"))
assert _PARAMS.itemsize == 232
LOCAL_SMEM = (2 * CHUNK * 132 + CHUNK * 68 + 2 * CHUNK) * 4
# W, Q [64][132]; U [64][40]; G [64]; P [64][68]; K [64][136]; S [128][40]; V' [64][40]; [64]
STATE_SMEM = (2 * CHUNK * 132 + CHUNK * 40 + CHUNK + CHUNK * 68 + CHUNK * 136 + DMAX * 40
              + CHUNK * 40 + CHUNK) * 4


def max_chunks(n_tokens: int, n_segments: int) -> int:
    """Upper bound of the chunks of n_tokens split into n_segments segments."""
    return (n_tokens + CHUNK - 1) // CHUNK + n_segments


@dataclasses.dataclass(frozen=True)
class ChunkWorkspace:
    """Intermediates of gdn_chunk_prefill for up to `max_tokens` tokens and `max_segments`."""

    w: object        # f32 [max_tokens, Hv, 128]
    u: object        # f32 [max_tokens, Hv, 128]
    gam: object      # f32 [max_tokens, Hv]
    p: object        # f32 [max_chunks, Hv, 64, 64]
    offsets: object  # i32 [max_segments + 1]

    @classmethod
    def allocate(cls, max_tokens: int, max_segments: int, value_heads: int):
        cp = C.cupy()
        nb = max_chunks(max_tokens, max_segments)
        return cls(cp.empty((max_tokens, value_heads, DMAX), dtype=np.float32),
                   cp.empty((max_tokens, value_heads, DMAX), dtype=np.float32),
                   cp.empty((max_tokens, value_heads), dtype=np.float32),
                   cp.empty((nb, value_heads, CHUNK, CHUNK), dtype=np.float32),
                   cp.empty(max_segments + 1, dtype=np.int32))

    def fits(self, n_tokens: int, n_segments: int, value_heads: int) -> bool:
        return (self.w.shape[0] >= n_tokens and self.w.shape[1] == value_heads
                and self.offsets.shape[0] >= n_segments + 1
                and self.p.shape[0] >= max_chunks(n_tokens, n_segments))


def _prepare_smem(fn, nbytes: int) -> None:
    if nbytes > 48 * 1024 and fn.max_dynamic_shared_size_bytes < nbytes:
        fn.max_dynamic_shared_size_bytes = nbytes


def gdn_chunk_prefill(q, k, v, g, beta, state, seg_starts, seg_slots, out, *,
                      workspace: ChunkWorkspace | None = None) -> None:
    """Chunkwise gated delta rule over segments (operands as `gdn_recurrence`; dk, dv <= 128)."""
    f = O.recurrence_operands(q, k, v, g, beta, state, seg_starts, seg_slots, out)
    n = f.pop("n")
    C.require(f["dk"] <= DMAX and f["dv"] <= DMAX, "q", f"dk, dv must be <= {DMAX}")
    segs, heads = f["num_segs"], f["value_heads"]
    if n == 0 or segs == 0:
        return
    if workspace is None:
        workspace = ChunkWorkspace.allocate(n, segs, heads)
    C.require(workspace.fits(n, segs, heads), "workspace",
              f"too small for {n} tokens, {segs} segments, {heads} heads")
    nb = max_chunks(n, segs)
    # 16-byte cp.async of q / k rows needs 16-byte aligned bases and strides (else 4-byte copies)
    vec_qk = all(f[a] % 16 == 0 for a in ("q", "k")) and all(
        f[st] % 4 == 0 for st in ("q_rs", "q_hs", "k_rs", "k_hs"))
    params = C.pack(_PARAMS, **f, chunk_offsets=C.ptr(workspace.offsets),
                    w_ws=C.ptr(workspace.w), u_ws=C.ptr(workspace.u),
                    gam_ws=C.ptr(workspace.gam), p_ws=C.ptr(workspace.p), max_chunks=nb,
                    vec_qk=int(vec_qk), pad_=0)
    launch(get_function(SOURCE, "gdn_chunk_offsets_kernel"), (1,), (32,), (params,),
           name="gdn_chunk_offsets")
    local = get_function(SOURCE, "gdn_chunk_local_kernel")
    _prepare_smem(local, LOCAL_SMEM)
    launch(local, (nb, heads), (256,), (params,), shared_mem=LOCAL_SMEM, name="gdn_chunk_local")
    state_fn = get_function(SOURCE, "gdn_chunk_state_kernel")
    _prepare_smem(state_fn, STATE_SMEM)
    launch(state_fn, (segs, heads, (f["dv"] + 31) // 32), (256,), (params,),
           shared_mem=STATE_SMEM, name="gdn_chunk_state")
