"""Side-by-side peers for `ninfer-bench kernels`: cuBLAS (GEMM/GEMV), flash-linear-attention's
Triton GDN kernels, torch SDPA. Each returns a timing callable, or raises PeerUnavailable with
the reason (printed in the report, never fatal)."""
from __future__ import annotations

import importlib.util



class PeerUnavailable(Exception):
    pass


def fla_status() -> str:
    """'installed <version>' or 'not installed' for flash-linear-attention (module `fla`)."""
    if importlib.util.find_spec("fla") is None:
        return "not installed"
    try:
        import fla

        return f"installed {getattr(fla, '__version__', '?')}"
    except Exception as exc:  # broken install: report it, never fail the run
        return f"import failed: {type(exc).__name__}: {exc}"


def cublas_gemm(cp, m: int, n: int, k: int, w_bf16, x_bf16, out_f32):
    """cuBLAS out[n, m] = x[n, k] @ w[m, k]^T (bf16 in, fp32 accumulate and out)."""
    from ninfer.kernels_cuda import _cublas

    def run(i: int) -> None:
        _cublas.gemm_ex(_cublas.OP_T, _cublas.OP_N, m, n, k, w_bf16.data.ptr, _cublas.R_16BF, k,
                        x_bf16.data.ptr, _cublas.R_16BF, k, out_f32.data.ptr, m)

    return run


def _torch():
    try:
        import torch
    except Exception as exc:
        raise PeerUnavailable(f"torch: {exc}") from exc
    if not torch.cuda.is_available():
        raise PeerUnavailable("torch has no CUDA device")
    return torch


def _on_cupy_stream(torch, fn):
    """Run torch work on CuPy's current stream, where the benchmark's CUDA events are recorded."""
    import cupy

    torch.cuda.synchronize()  # inputs were made on torch's stream; the peer runs on CuPy's
    stream = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)

    def run(i: int) -> None:
        with torch.cuda.stream(stream):
            fn()

    return run


def torch_sdpa(heads: int, kv_heads: int, tokens: int, head_dim: int):
    """torch SDPA causal prefill attention on bf16 [1, heads, tokens, head_dim] (GQA)."""
    torch = _torch()
    q = torch.randn(1, heads, tokens, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, kv_heads, tokens, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, kv_heads, tokens, head_dim, device="cuda", dtype=torch.bfloat16)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    run = _on_cupy_stream(torch, lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True))
    run(0)
    return run, "torch SDPA (bf16)"


def _fla_inputs(torch, tokens, hk, hv, dk, dv, batch=1):
    dev, bf = "cuda", torch.bfloat16
    q = torch.nn.functional.normalize(torch.randn(batch, tokens, hv, dk, device=dev), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(batch, tokens, hv, dk, device=dev), dim=-1)
    v = torch.randn(batch, tokens, hv, dv, device=dev)
    g = -torch.rand(batch, tokens, hv, device=dev) * 0.1
    beta = torch.rand(batch, tokens, hv, device=dev)
    return q.to(bf), k.to(bf), v.to(bf), g, beta.to(bf)


def fla_chunk(tokens: int, hk: int, hv: int, dk: int, dv: int):
    """FLA's Triton chunk_gated_delta_rule on bf16 inputs (q, k repeated to Hv heads, as HF)."""
    if importlib.util.find_spec("fla") is None:
        raise PeerUnavailable("flash-linear-attention not installed")
    torch = _torch()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    q, k, v, g, beta = _fla_inputs(torch, tokens, hk, hv, dk, dv)
    state = torch.zeros(1, hv, dk, dv, device="cuda", dtype=torch.float32)

    run = _on_cupy_stream(torch, lambda: chunk_gated_delta_rule(
        q, k, v, g, beta, scale=dk ** -0.5, initial_state=state, output_final_state=True))
    run(0)
    return run, "FLA chunk_gated_delta_rule (bf16, Triton)"


def fla_recurrent(batch: int, hk: int, hv: int, dk: int, dv: int):
    """FLA's fused_recurrent_gated_delta_rule for one decode token per sequence."""
    if importlib.util.find_spec("fla") is None:
        raise PeerUnavailable("flash-linear-attention not installed")
    torch = _torch()
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    q, k, v, g, beta = _fla_inputs(torch, 1, hk, hv, dk, dv, batch)
    state = torch.zeros(batch, hv, dk, dv, device="cuda", dtype=torch.float32)

    run = _on_cupy_stream(torch, lambda: fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, scale=dk ** -0.5, initial_state=state, output_final_state=True))
    run(0)
    return run, "FLA fused_recurrent_gated_delta_rule (Triton)"
