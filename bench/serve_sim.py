"""Simulated serving through the public Engine on the GPU (random weights at a real shape).

    ninfer-bench serve-sim --shape 9b --concurrency 1,4,8 --prompt 1024 --output 256 \
        [--prefill-chunk N]  (default: the engine's CUDA default, DEFAULT_PREFILL_CHUNK)
        [--rounds R]  (the sweep R times, levels interleaved; each level reports its median run)

For each concurrency C: C requests (random prompts of `prompt` tokens, greedy, EOS ignored,
`output` tokens each) are submitted at once to an Engine with max_concurrency = C. Reports total
output tokens/s, mean TPOT (time per output token after the first) and TTFT, the mean engine
step time, the time spent inside the Program's `execute` (GPU work + its own upload/download),
and the engine's host time per step outside it.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np


def run_serve_sim(shape, concurrencies: list[int], prompt: int, output: int,
                  json_path: str | None, prefill_chunk: int | None = None,
                  rounds: int = 1) -> int:
    import cupy as cp

    from bench.model import shape_config
    from ninfer.core.cuda.device import DeviceContext
    from ninfer.core.dtypes import DType
    from ninfer.models.qwen3_5.cuda_backend import CudaBackend
    from ninfer.models.qwen3_5.random_params import random_parameters
    from ninfer.models.qwen3_5.startup import ProgramOptions, build_program, plan_capacity
    from ninfer.runtime.contract import SamplingParams
    from ninfer.runtime.contract.output import TokenOutputSession
    from ninfer.runtime.engine import Engine
    from ninfer.runtime.request import GenerationRequest

    max_c = max(concurrencies)
    context = prompt + output + 8
    cfg, _, _ = shape_config(shape, context)
    opts = ProgramOptions(device="cuda", max_concurrency=max_c, prefill_chunk=prefill_chunk,
                          page_size=64, max_context_len=context,
                          num_pages=max_c * -(-context // 64) + 1)
    plan = plan_capacity(cfg, opts, DType.BFLOAT16)
    params = random_parameters(cfg, xp=cp, seed=1)
    backend = CudaBackend(cfg, params, DeviceContext(0), num_pages=plan.num_pages,
                          page_size=plan.page_size, num_slots=plan.num_slots, max_batch=max_c,
                          prefill_chunk=opts.prefill_chunk, max_context_len=context)
    backend.capture_graphs()
    program = build_program(cfg, opts, plan, backend)
    inner = backend.execute
    exec_s = [0.0]

    def timed_execute(num_decode: int) -> None:
        t = time.perf_counter()
        inner(num_decode)
        exec_s[0] += time.perf_counter() - t

    backend.execute = timed_execute
    rng = np.random.default_rng(5)
    # warm-up: one short request compiles the prefill kernels and fills cuBLAS's caches (the
    # first timed level would otherwise pay it in its TTFT)
    warm = Engine(program, max_concurrency=1, max_queue=1)
    warm.submit(GenerationRequest(
        prompt_token_ids=tuple(int(t) for t in rng.integers(0, cfg.vocab_size, prompt)),
        sampling=SamplingParams(temperature=0.0), max_tokens=4,
        session=TokenOutputSession(()))).wait()
    warm.shutdown()
    runs: dict[int, list[dict]] = {c: [] for c in concurrencies}
    for _ in range(rounds):  # levels interleaved, so slow drift of the machine hits all alike
        for c in concurrencies:
            runs[c].append(_serve_level(program, cfg, c, prompt, output, rng, exec_s))
    rows = []
    for c in concurrencies:
        by_rate = sorted(runs[c], key=lambda r: r["tokens_per_s"])
        row = dict(by_rate[(len(by_rate) - 1) // 2])  # the median run (lower when even)
        row["tokens_per_s_runs"] = [r["tokens_per_s"] for r in runs[c]]
        rows.append(row)
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_first"] = row["tokens_per_s"] / base
    result = dict(shape=shape.name, prompt=prompt, output=output,
                  prefill_chunk=opts.prefill_chunk, rounds=rounds, rows=rows)
    print(f"serve-sim {shape.name}: prompt {prompt}, output {output}, prefill chunk "
          f"{opts.prefill_chunk}, {rounds} round(s) (median run per level)")
    print(f"{'C':>2} {'tok/s':>8} {'x C1':>6} {'TPOT ms':>8} {'TTFT ms':>8} {'step ms':>8} "
          f"{'exec ms':>8} {'host ms':>8}")
    for r in rows:
        print(f"{r['concurrency']:>2} {r['tokens_per_s']:8.1f} {r['speedup_vs_first']:6.2f} "
              f"{r['mean_tpot_ms']:8.2f} {r['mean_ttft_ms']:8.1f} {r['step_ms']:8.2f} "
              f"{r['execute_ms']:8.2f} {r['host_ms']:8.2f}  runs "
              + " ".join(f"{x:.1f}" for x in r["tokens_per_s_runs"]), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _serve_level(program, cfg, c: int, prompt: int, output: int, rng, exec_s: list) -> dict:
    """One level: C requests submitted at once to a fresh Engine; its figures (see module)."""
    from ninfer.runtime.contract import SamplingParams
    from ninfer.runtime.contract.output import TokenOutputSession
    from ninfer.runtime.engine import Engine
    from ninfer.runtime.request import GenerationRequest

    engine = Engine(program, max_concurrency=c, max_queue=c)
    reqs = [GenerationRequest(prompt_token_ids=tuple(int(t) for t in rng.integers(
                0, cfg.vocab_size, prompt)), sampling=SamplingParams(temperature=0.0, seed=i),
                max_tokens=output, session=TokenOutputSession(()))
            for i in range(c)]
    exec_s[0] = 0.0
    t0 = time.perf_counter()
    handles = [engine.submit(r) for r in reqs]
    results = [h.wait() for h in handles]
    wall = time.perf_counter() - t0
    steps = engine.metrics_snapshot()["counters"]["steps"]
    engine.shutdown()
    tpot = [(r.timings.total_s - r.timings.ttft_s) / max(1, r.completion_tokens - 1)
            for r in results]
    out_tokens = sum(r.completion_tokens for r in results)
    return dict(
        concurrency=c, output_tokens=out_tokens, wall_s=wall,
        tokens_per_s=out_tokens / wall, mean_tpot_ms=1e3 * statistics.mean(tpot),
        mean_ttft_ms=1e3 * statistics.mean(r.timings.ttft_s for r in results),
        steps=steps, step_ms=1e3 * wall / steps, execute_ms=1e3 * exec_s[0] / steps,
        host_ms=1e3 * (wall - exec_s[0]) / steps)
