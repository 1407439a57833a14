"""Whole-model benchmarks at the real Qwen3.5 shapes with random weights drawn on the GPU.

    ninfer-bench decode  --shape 9b --batch 1,8 [--context 1024] [--hf] [--json OUT]
    ninfer-bench prefill --shape 9b --tokens 8192 [--chunk 2048] [--eager] [--hf] [--json OUT]

decode: one CUDA-graph replay per step for B rows at position `context` (their KV pages and
recurrent state are allocated; values do not change the cost). Reports GPU ms per step (graph
replay timed with CUDA events, median), the engine-side wall time of a whole `execute` (input
upload + replay + token download) and the host overhead between the two, tokens/s, bytes read
per step and the ratio to the copy-bandwidth roofline measured in the same run.
prefill: `tokens` tokens of one sequence in `chunk`-token chunks (full chunks replay the prefill
graph after the first, as in serving; `--eager` launches every chunk's kernels instead);
reports ms, tokens/s, FLOPs (2 x active parameters x tokens + causal attention) and the ratio to
the measured bf16 matmul rate. `--hf` adds transformers on the same shape (random init, bf16,
FLA kernels when installed) side by side.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time

import numpy as np

from bench.harness import BenchContext, measure_ceilings, median
from bench.shapes import ModelShape


def shape_config(shape: ModelShape, max_context: int):
    from ninfer.models.qwen3_5.config import Qwen35Config

    interval = shape.layers // shape.full_attention_layers
    raw = dict(
        vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        layer_types=["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(shape.layers)],
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, linear_num_key_heads=shape.key_heads,
        linear_num_value_heads=shape.value_heads, linear_key_head_dim=shape.dk,
        linear_value_head_dim=shape.dv, linear_conv_kernel_dim=shape.conv, rms_norm_eps=1e-6,
        max_position_embeddings=max_context, tie_word_embeddings=False, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    )
    if shape.experts:
        raw.update(num_experts=shape.experts, num_experts_per_tok=shape.top_k,
                   moe_intermediate_size=shape.moe_inter,
                   shared_expert_intermediate_size=shape.shared_inter)
        arch = "Qwen3_5MoeForCausalLM"
    else:
        raw.update(intermediate_size=shape.intermediate)
        arch = "Qwen3_5ForCausalLM"
    return Qwen35Config.from_hf(raw, architecture=arch), raw, arch


def _weight_bytes(params, cfg, batch: int) -> float:
    """Weight bytes one decode step of `batch` rows streams (MoE: expected distinct experts)."""
    from ninfer.models.qwen3_5.parameters import MoEParams, all_weights

    total = 0.0
    for layer in params.layers:
        for w in all_weights(layer):
            total += w.nbytes
        if isinstance(layer.ffn, MoEParams):
            e, k = cfg.num_experts, cfg.num_experts_per_tok
            distinct = e * (1 - (1 - k / e) ** batch)
            routed = layer.ffn.experts_gate_up.nbytes + layer.ffn.experts_down.nbytes
            total -= routed * (1 - distinct / e)
    total += params.final_norm.nbytes + params.lm_head.nbytes
    total += batch * params.embed.nbytes / params.embed.shape[0]
    return total


def _state_bytes(cfg, batch: int, context: int) -> float:
    rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv = (cfg.linear_conv_kernel_dim - 1) * cfg.conv_channels * 4
    gdn = 2 * (rec + conv) * len(cfg.linear_attention_layers)
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim * 2 * context * len(cfg.full_attention_layers)
    return batch * (gdn + kv)


def _build(cfg, params, batch_max: int, context: int, prefill_chunk: int, page_size: int = 64):
    from ninfer.core.cuda.device import DeviceContext
    from ninfer.models.qwen3_5.cuda_backend import CudaBackend

    device = DeviceContext(0)
    pages = batch_max * -(-(context + 1) // page_size) + 1
    backend = CudaBackend(cfg, params, device, num_pages=pages, page_size=page_size,
                          num_slots=batch_max + 1, max_batch=batch_max,
                          prefill_chunk=prefill_chunk, max_context_len=context + 1)
    return device, backend


@contextlib.contextmanager
def decode_rows(backend, cfg, b: int, context: int, rng):
    """B decode rows at position `context` in the backend's step and sampler inputs (greedy, a
    slot and pages each, decode inputs uploaded); the slots and pages are freed on exit."""
    from ninfer.models.qwen3_5.sequences import SequenceRecord
    from ninfer.runtime.contract import SamplingParams

    inp = backend.step_inputs
    inp.reset()
    recs, held = [], []
    try:
        for i in range(b):
            slot = backend.allocate_slot()
            pages = backend.pages.allocate(-(-(context + 1) // backend.kv.page_size))
            held.append((slot, pages))
            backend.set_block_table(slot, pages)
            inp.add_segment(slot, [int(rng.integers(0, cfg.vocab_size))], context)
            recs.append(SequenceRecord(i, [1] * (context + 1), context,
                                       SamplingParams(temperature=0.0, seed=i)))
        backend.sampler_inputs.fill(recs)
        with backend.device.activate():
            backend._load_decode_inputs(inp, 0, b)
        yield
    finally:
        for slot, pages in held:
            backend.free_slot(slot)
            backend.pages.free(pages)


def run_decode(shape: ModelShape, batches: list[int], context: int, repeat: int, hf: bool,
               json_path: str | None) -> int:
    import cupy as cp

    from ninfer.core.cuda import median_ms, time_device
    from ninfer.models.qwen3_5.random_params import random_parameters

    ctx = BenchContext(shape, np.random.default_rng(0), l2_bytes=60 << 20, repeat=repeat)
    ceilings = measure_ceilings(ctx)
    cfg, raw, arch = shape_config(shape, context + 1)
    params = random_parameters(cfg, xp=cp, seed=1)
    device, backend = _build(cfg, params, max(batches), context, prefill_chunk=64)
    t0 = time.perf_counter()
    backend.capture_graphs()
    capture_s = time.perf_counter() - t0
    rng = np.random.default_rng(2)
    rows = []
    for b in batches:
        with decode_rows(backend, cfg, b, context, rng):
            graph = backend.graphs[b]
            with device.activate():
                gpu_ms = median_ms(time_device(lambda i: graph.launch(device.stream), warmup=3,
                                               repeat=repeat))
            walls = []
            for _ in range(repeat):
                t = time.perf_counter()
                backend.execute(num_decode=b)
                walls.append((time.perf_counter() - t) * 1e3)
        wall_ms = median(walls)
        nbytes = _weight_bytes(params, cfg, b) + _state_bytes(cfg, b, context)
        floor_ms = nbytes / (ceilings.copy_gbps * 1e9) * 1e3
        rows.append(dict(batch=b, gpu_ms=gpu_ms, wall_ms=wall_ms, host_ms=wall_ms - gpu_ms,
                         tokens_per_s=b / (wall_ms / 1e3), bytes=nbytes, floor_ms=floor_ms,
                         roofline=floor_ms / gpu_ms))
    result = dict(shape=shape.name, context=context, capture_s=capture_s,
                  ceilings=dataclasses.asdict(ceilings), ours=rows)
    backend.destroy_graphs()
    backend = params = None  # drop our model before the transformers peer loads
    cp.get_default_memory_pool().free_all_blocks()  # transformers needs the memory next
    if hf:
        result["transformers"] = _hf_decode(raw, arch, batches, context, repeat)
    _report(result, json_path, _decode_table)
    return 0


def run_prefill(shape: ModelShape, tokens: int, chunk: int, repeat: int, hf: bool,
                json_path: str | None, eager: bool = False) -> int:
    import cupy as cp

    from ninfer.models.qwen3_5.random_params import random_parameters

    ctx = BenchContext(shape, np.random.default_rng(0), l2_bytes=60 << 20, repeat=repeat)
    ceilings = measure_ceilings(ctx)
    cfg, raw, arch = shape_config(shape, tokens + 1)
    params = random_parameters(cfg, xp=cp, seed=1)
    device, backend = _build(cfg, params, 1, tokens, prefill_chunk=chunk)
    backend.use_graphs = not eager  # chunks replay the prefill graphs unless --eager
    if not eager:
        backend.capture_prefill_graphs()
    slot = backend.allocate_slot()
    backend.set_block_table(slot, backend.pages.allocate(-(-(tokens + 1) // backend.kv.page_size)))
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, tokens).tolist()

    issue = []  # host seconds spent inside execute (launching), per run

    def once() -> float:
        backend.zero_state(slot)
        device.synchronize()
        t = time.perf_counter()
        spent = 0.0
        for start in range(0, tokens, chunk):
            inp = backend.step_inputs
            inp.reset()
            inp.add_segment(slot, ids[start:start + chunk], start)
            t_issue = time.perf_counter()
            backend.execute(num_decode=0)
            spent += time.perf_counter() - t_issue
        device.synchronize()
        issue.append(spent * 1e3)
        return (time.perf_counter() - t) * 1e3

    once()  # warm-up: kernel compilation, cuBLAS heuristics
    issue.clear()
    ms = median([once() for _ in range(max(1, repeat // 5))])
    issue_ms = median(issue)
    flops = _prefill_flops(params, cfg, tokens)
    floor_ms = flops / (ceilings.matmul_tflops * 1e12) * 1e3
    result = dict(shape=shape.name, tokens=tokens, chunk=chunk, eager=eager,
                  prefill_graph=bool(backend.prefill_graphs) and not eager,
                  ceilings=dataclasses.asdict(ceilings),
                  ours=[dict(ms=ms, issue_ms=issue_ms, tokens_per_s=tokens / (ms / 1e3),
                             flops=flops, floor_ms=floor_ms, matmul_ratio=floor_ms / ms)])
    backend = params = None  # drop our model before the transformers peer loads
    cp.get_default_memory_pool().free_all_blocks()
    if hf:
        result["transformers"] = _hf_prefill(raw, arch, tokens)
    _report(result, json_path, _prefill_table)
    return 0


def _prefill_flops(params, cfg, tokens: int) -> float:
    from ninfer.models.qwen3_5.parameters import MoEParams, all_weights

    dense = 0.0
    for layer in params.layers:
        n = sum(w.data.size for w in all_weights(layer))
        if isinstance(layer.ffn, MoEParams):
            routed = layer.ffn.experts_gate_up.data.size + layer.ffn.experts_down.data.size
            n -= routed * (1 - cfg.num_experts_per_tok / cfg.num_experts)
        dense += n
    dense += params.lm_head.data.size / tokens  # only the sampled row needs the head
    attn = (len(cfg.full_attention_layers) * 2 * 2 * cfg.num_attention_heads * cfg.head_dim
            * tokens * tokens / 2)
    return 2 * dense * tokens + attn


def _hf_model(raw: dict, arch: str):
    import torch
    import transformers

    cls = getattr(transformers, arch)
    config_cls = cls.config_class
    config = config_cls(**raw)
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = cls(config).to(torch.bfloat16).eval()
    return torch, model


def _fla() -> str:
    try:
        import fla  # noqa: F401

        return "installed"
    except Exception:
        return "not installed"


def _hf_decode(raw, arch, batches, context, repeat) -> dict:
    try:
        torch, model = _hf_model(raw, arch)
    except Exception as exc:  # report, do not fail the run
        return dict(error=f"{type(exc).__name__}: {exc}")
    out = dict(fla=_fla(), rows=[])
    for b in batches:
        try:
            ids = torch.randint(0, raw["vocab_size"], (b, context), device="cuda")
            with torch.no_grad():
                cache = model(ids, use_cache=True).past_key_values
                nxt = torch.randint(0, raw["vocab_size"], (b, 1), device="cuda")
                times = []
                for i in range(repeat + 3):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    model(nxt, past_key_values=cache, use_cache=True)
                    torch.cuda.synchronize()
                    if i >= 3:
                        times.append((time.perf_counter() - t) * 1e3)
            ms = median(times)
            out["rows"].append(dict(batch=b, ms=ms, tokens_per_s=b / (ms / 1e3)))
        except Exception as exc:
            out["rows"].append(dict(batch=b, error=f"{type(exc).__name__}: {exc}"))
        torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
    return out


def _hf_prefill(raw, arch, tokens) -> dict:
    try:
        torch, model = _hf_model(raw, arch)
        ids = torch.randint(0, raw["vocab_size"], (1, tokens), device="cuda")
        with torch.no_grad():
            model(ids[:, :256])
            torch.cuda.synchronize()
            t = time.perf_counter()
            model(ids, logits_to_keep=1)
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        del model
        torch.cuda.empty_cache()
        return dict(fla=_fla(), ms=ms, tokens_per_s=tokens / (ms / 1e3))
    except Exception as exc:
        return dict(error=f"{type(exc).__name__}: {exc}")


def _decode_table(r: dict) -> str:
    c = r["ceilings"]
    lines = [f"decode {r['shape']} context {r['context']}: copy {c['copy_gbps']:.0f} GB/s, "
             f"graph capture {r['capture_s']:.1f} s",
             f"{'B':>3} {'gpu ms':>8} {'wall ms':>8} {'host ms':>8} {'tok/s':>9} "
             f"{'GB/step':>8} {'floor ms':>8} {'roofline':>8}"]
    for row in r["ours"]:
        lines.append(f"{row['batch']:>3} {row['gpu_ms']:8.3f} {row['wall_ms']:8.3f} "
                     f"{row['host_ms']:8.3f} {row['tokens_per_s']:9.1f} {row['bytes'] / 1e9:8.2f} "
                     f"{row['floor_ms']:8.3f} {row['roofline']:8.2f}")
    if "transformers" in r:
        lines.append(f"transformers (FLA {r['transformers'].get('fla', '?')}): "
                     + json.dumps(r["transformers"].get("rows", r["transformers"])))
    return "\n".join(lines)


def _prefill_table(r: dict) -> str:
    o = r["ours"][0]
    c = r["ceilings"]
    how = "graph" if r.get("prefill_graph") else "eager"
    text = (f"prefill {r['shape']} {r['tokens']} tokens (chunk {r['chunk']}, {how}): "
            f"{o['ms']:.1f} ms, "
            f"{o['tokens_per_s']:.0f} tok/s, {o['flops'] / 1e12:.1f} TFLOP, matmul "
            f"{c['matmul_tflops']:.0f} TFLOP/s -> ratio {o['matmul_ratio']:.2f}; host launching "
            f"{o['issue_ms']:.1f} ms")
    if "transformers" in r:
        text += "\ntransformers: " + json.dumps(r["transformers"])
    return text


def _report(result: dict, json_path: str | None, table) -> None:
    print(table(result), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
