"""Launcher for attn_prep.cu: `attn_prep(...)`, the gated-attention inputs in one launch.

Equivalent (bit for bit) to rms_norm(q, zero_centered) -> rope(q), rms_norm(k) -> rope(k) ->
kv_write(k, v), plus the copy of the gate halves (ninfer.ops.attn_prep documents the operands).
Launched with programmatic dependent launch allowed (`_loader.launch(..., pdl=True)`).
"""
from __future__ import annotations

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch
from ninfer.kernels_cuda.norm import block_threads
from ninfer.kernels_cuda.rope import rope_operands

_NV = (1, 2, 4)
SOURCE = KernelSource("attn_prep.cu", tuple(
    f"attn_prep_kernel<{w.ctype}, {k.ctype}, {nv}>" for w in C.WKind for k in C.WKind
    for nv in _NV))
_PARAMS = C.struct(*[(f, "ptr") for f in (
    "qg", "k", "v", "q_norm", "k_norm", "q_out", "gate_out", "k_pages", "v_pages",
    "block_tables", "row_seq", "row_pos", "positions", "inv_freq", "freq_axis")],
    *[(f, "i64") for f in ("qg_rs", "qg_hs", "k_rs", "k_hs", "v_rs", "v_hs", "q_rs", "q_hs",
                           "g_rs", "g_hs", "bt_rs", "pos_rs")],
    *[(f, "i32") for f in ("num_pages", "page_size", "kv_heads", "q_heads", "num_seqs",
                           "bt_cols", "dim", "half")],
    ("eps", "f32"), ("pad", "i32"))
assert _PARAMS.itemsize == 256


def attn_prep(q_and_gate, k, v, q_norm, k_norm, eps: float, positions, inv_freq, freq_axis,
              q_out, gate_out, k_pages, v_pages, block_tables, row_seq, row_pos) -> None:
    """q_and_gate f32[N, A, 2D], k, v f32[N, Hkv, D] (rows/heads strided, inner contiguous);
    q_norm, k_norm [D] (f32 or bf16); positions i32[3, N]; inv_freq f32[R/2], freq_axis
    i32[R/2]; q_out, gate_out f32[N, A, D]; pages [P, Hkv, page_size, D] f32 or bf16;
    block_tables i32[S, cols]; row_seq, row_pos i32[N]."""
    C.device_array(q_and_gate, "q_and_gate", ndim=3)
    n, a, d2 = q_and_gate.shape
    d = d2 // 2
    C.require(d2 == 2 * d, "q_and_gate", f"last axis {d2} is not 2 * head_dim")
    qg_rs, qg_hs = C.per_head(q_and_gate, "q_and_gate", n, a, d2)
    C.device_array(k, "k", ndim=3)
    hkv = k.shape[1]
    k_rs, k_hs = C.per_head(k, "k", n, hkv, d)
    v_rs, v_hs = C.per_head(v, "v", n, hkv, d)
    q_rs, q_hs = C.per_head(q_out, "q_out", n, a, d)
    g_rs, g_hs = C.per_head(gate_out, "gate_out", n, a, d)
    qn, wkind = C.weight_array(q_norm, "q_norm")
    kn, kkind = C.weight_array(k_norm, "k_norm")
    C.require(qn.shape == (d,) and kn.shape == (d,), "q_norm", f"norm weights must be ({d},)")
    C.require(wkind is kkind, "k_norm", "q_norm and k_norm must have the same dtype")
    kp, vp, kv_kind = C.kv_pages(k_pages, v_pages)
    num_pages, kv_heads, page_size, dim = kp.shape
    C.require(kv_heads == hkv and dim == d, "k_pages",
              f"pages {tuple(kp.shape)} do not hold {hkv} heads of {d}")
    pos_rs, half = rope_operands(positions, inv_freq, freq_axis, n, d)
    bt_rs = C.row_targets(block_tables, row_seq, row_pos, n)
    C.require(eps >= 0.0, "eps", f"must be >= 0, got {eps}")
    threads = block_threads(d)
    nv = -(-d // threads)
    C.require(nv in _NV, "q_and_gate", f"head dim {d} too large (at most {threads * _NV[-1]})")
    if n == 0:
        return
    params = C.pack(_PARAMS, qg=C.ptr(q_and_gate), k=C.ptr(k), v=C.ptr(v), q_norm=C.ptr(qn),
                    k_norm=C.ptr(kn), q_out=C.ptr(q_out), gate_out=C.ptr(gate_out),
                    k_pages=C.ptr(kp), v_pages=C.ptr(vp), block_tables=C.ptr(block_tables),
                    row_seq=C.ptr(row_seq), row_pos=C.ptr(row_pos), positions=C.ptr(positions),
                    inv_freq=C.ptr(inv_freq), freq_axis=C.ptr(freq_axis), qg_rs=qg_rs,
                    qg_hs=qg_hs, k_rs=k_rs, k_hs=k_hs, v_rs=v_rs, v_hs=v_hs, q_rs=q_rs,
                    q_hs=q_hs, g_rs=g_rs, g_hs=g_hs, bt_rs=bt_rs, pos_rs=pos_rs,
                    num_pages=num_pages, page_size=page_size, kv_heads=kv_heads, q_heads=a,
                    num_seqs=block_tables.shape[0], bt_cols=block_tables.shape[1], dim=d,
                    half=half, eps=eps)
    fn = get_function(SOURCE, f"attn_prep_kernel<{wkind.ctype}, {kv_kind.ctype}, {nv}>")
    C.require(n <= 2**31 - 1 and a + hkv <= 65535, "q_and_gate", "too many rows or heads")
    launch(fn, (n, a + hkv), (threads,), (params,), shared_mem=d * 4, name="attn_prep",
           pdl=True)
