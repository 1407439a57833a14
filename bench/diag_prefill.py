"""Diagnostic (GPU): where does the CUDA prefill path deviate from the CPU backend?

Runs prompt_logits on a tiny fp32 model on both backends and prints the relative error per
position for several variants of the CUDA prefill path (each variant switches one fast path off).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.models.qwen35_cases import build_case, open_program, prompts  # noqa: E402


def per_position(a, b):
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


def main():
    root = Path(tempfile.mkdtemp())
    for name, dtype in (("tiny-dense", "float32"), ("tiny-moe", "float32"),
                        ("tiny-dense", "bfloat16")):
        case = build_case(root, name, dtype=dtype)
        name = f"{name}/{dtype[:4]}"
        (prompt,) = prompts(case.vocab_size, [40], seed=1)
        cpu = open_program(case, prefill_chunk=16).prompt_logits(prompt)
        import ninfer.kernels_cuda.attention as att
        import ninfer.kernels_cuda.linear as lin
        import ninfer.kernels_cuda.moe as moe
        variants = {}
        for label, chunk, patch in (
            ("chunk16", 16, None), ("chunk64", 64, None), ("chunk8", 8, None),
            ("chunk16 recurrence", 16, "recurrence"), ("chunk16 nosplit", 16, "nosplit"),
            ("chunk16 gemv", 16, "gemv"), ("chunk16 moe-gemv", 16, "moegemv"),
        ):
            saved = (att.SPLIT_MAX_ROWS, lin.GEMV_MAX_ROWS, moe.GEMV_MAX_ROWS)
            if patch == "moegemv":
                moe.GEMV_MAX_ROWS = 1 << 30
            if patch == "nosplit":
                att.SPLIT_MAX_ROWS = 0
            if patch == "gemv":
                lin.GEMV_MAX_ROWS = 1 << 30
            try:
                prog = open_program(case, device="cuda", prefill_chunk=chunk)
                if patch == "recurrence":
                    prog.backend.prefill_kws.chunked_gdn_prefill = False
                gpu = prog.prompt_logits(prompt)
                err = per_position(gpu, cpu)
                variants[label] = err
                print(f"{name:10s} {label:22s} total {np.linalg.norm(gpu - cpu) / np.linalg.norm(cpu):.2e}"
                      f" first-bad-pos {int(np.argmax(err > 1e-4)) if (err > 1e-4).any() else -1}"
                      f" per-pos {' '.join(f'{e:.0e}' for e in err[::4])}", flush=True)
            except Exception as exc:
                print(f"{name} {label}: {type(exc).__name__}: {exc}", flush=True)
            finally:
                att.SPLIT_MAX_ROWS, lin.GEMV_MAX_ROWS, moe.GEMV_MAX_ROWS = saved


if __name__ == "__main__":
    main()
