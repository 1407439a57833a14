"""Whole-model CPU benchmark: decode and prefill tokens/s of the CPU backend.

    ninfer-bench cpu [--model demo|0.8b] [--prompt 256] [--decode 32] [--json OUT]

`demo` is the embedded demo model (its artifact, bf16); `0.8b` draws random bf16 weights at the
Qwen3.5-0.8B shape on the host. Prefill feeds `prompt` tokens in 128-token chunks; decode runs
`decode` greedy single-row steps after it. Reports ms/token, tokens/s and the weight bandwidth
a decode step implies (bytes of every weight read once / step time).
"""
from __future__ import annotations

import json
import time

import numpy as np


def _program(model: str, context: int):
    from ninfer.models.qwen3_5.startup import ProgramOptions

    opts = ProgramOptions(max_concurrency=1, prefill_chunk=128, max_context_len=context)
    if model == "demo":
        from ninfer.models.registry import load_model_instance
        from tools.demo import demo_artifact_path

        inst = load_model_instance(demo_artifact_path(progress=False), opts)
        return inst.loaded.config, inst.loaded.params, inst.program
    from bench.model import shape_config
    from bench.shapes import resolve
    from ninfer.models.qwen3_5.cpu_backend import CpuBackend
    from ninfer.models.qwen3_5.random_params import random_parameters
    from ninfer.models.qwen3_5.startup import build_program, plan_capacity
    from ninfer.core.dtypes import DType

    cfg, _, _ = shape_config(resolve(model), context)
    params = random_parameters(cfg, xp=np, seed=1)
    plan = plan_capacity(cfg, opts, DType.FLOAT32)
    backend = CpuBackend(cfg, params, num_pages=plan.num_pages, page_size=plan.page_size,
                         num_slots=plan.num_slots, max_batch=1, prefill_chunk=128,
                         max_context_len=plan.max_context_len)
    return cfg, params, build_program(cfg, opts, plan, backend)


def run_cpu(model: str, prompt_len: int, decode: int, json_path: str | None) -> int:
    from ninfer.models.qwen3_5.parameters import all_weights
    from ninfer.runtime.contract import PrefillChunk, RowDecision, SamplingParams, StepPlan

    cfg, params, program = _program(model, prompt_len + decode + 8)
    ids = np.random.default_rng(0).integers(0, min(cfg.vocab_size, 200000), prompt_len + 1)

    def one_run() -> tuple[float, float]:
        seq = program.open_sequence(ids.tolist(), SamplingParams(temperature=0.0, seed=1))
        t0 = time.perf_counter()
        while program.pending_prefill(seq):
            assert program.reserve_units(seq, program.next_unit_tokens(seq))
            program.commit(program.run(StepPlan(prefill=PrefillChunk(seq))), [RowDecision(0)])
        t1 = time.perf_counter()
        for _ in range(decode):
            assert program.reserve_units(seq, 1)
            program.commit(program.run(StepPlan(decode=(seq,))), [RowDecision(1)])
        t2 = time.perf_counter()
        program.release(seq)
        return t1 - t0, t2 - t1

    one_run()  # warm-up: Numba compilation / cache load
    prefill_s, decode_s = one_run()
    # every weight once per step; the embedding table is gathered (one row), not streamed
    # (a tied lm_head appears twice in the list and is streamed once)
    weight_bytes = sum(w.nbytes for w in all_weights(params)) - params.embed.nbytes
    step_s = decode_s / decode
    result = dict(model=model, prompt=prompt_len, decode=decode,
                  prefill_tokens_per_s=prompt_len / prefill_s, decode_ms=step_s * 1e3,
                  decode_tokens_per_s=1 / step_s, weight_gb=weight_bytes / 1e9,
                  implied_gbps=weight_bytes / step_s / 1e9)
    print(f"cpu {model}: prefill {result['prefill_tokens_per_s']:.0f} tok/s ({prompt_len} tokens), "
          f"decode {result['decode_ms']:.1f} ms/token = {result['decode_tokens_per_s']:.1f} tok/s, "
          f"weights {result['weight_gb']:.2f} GB -> {result['implied_gbps']:.1f} GB/s")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0
