"""Device start-up of a Qwen3.5 instance: upload weights, calibrate graphs, size the KV pool.

Order (seed, "startup plan"): weights are placed first; a calibration backend with a handful of
KV pages captures every decode graph (B = 1..max_concurrency) while device-memory snapshots are
taken before capture, after capture and after destroying the graphs; the calibration backend is
then dropped, and the real KV page count comes from what is left under the device budget
(`NINFER_VRAM_BUDGET_MIB`, else the free memory) after weights, workspace, the graph estimate
and >= 1 GiB headroom. The final backend captures its decode graphs before any request is
accepted; the prefill graph (dense models) is captured during the first full-size prompt chunk
and, with cuBLAS's 32 MiB workspace, lives in that headroom.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable

from ninfer import envs
from ninfer.core.dtypes import DType
from ninfer.core.kv_pool import PagedKVPool
from ninfer.errors import DeviceUnavailable, InvalidInput
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.parameters import Parameters
from ninfer.models.qwen3_5.startup import (
    MIB, CapacityPlan, ProgramOptions, plan_capacity, state_bytes_per_slot,
)

HEADROOM_BYTES = 1 << 30
log = logging.getLogger("ninfer.startup")


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _backend(cfg, params, device, opts, plan: CapacityPlan, num_pages: int, kv_dtype):
    from ninfer.models.qwen3_5.cuda_backend import CudaBackend

    return CudaBackend(cfg, params, device, num_pages=num_pages, page_size=plan.page_size,
                       num_slots=plan.num_slots, max_batch=opts.max_concurrency,
                       prefill_chunk=opts.prefill_chunk, max_context_len=plan.max_context_len,
                       kv_dtype=kv_dtype, batch_invariant_prefill=opts.batch_invariant_prefill)


def start_cuda_backend(cfg: Qwen35Config, opts: ProgramOptions,
                       bind: Callable[[Callable], Parameters]):
    """-> (device Parameters, CudaBackend with captured graphs, CapacityPlan)."""
    if not cuda_available():
        raise DeviceUnavailable("device 'cuda' was requested but no CUDA device is usable "
                                "(install the cuda12/cuda13 extra and check the driver)")
    import cupy as cp

    from ninfer.core.cuda import memory
    from ninfer.core.cuda.device import DeviceContext

    device = DeviceContext(0)
    with device.activate():
        start = memory.snapshot("start")
        params = bind(lambda host: cp.asarray(host))
    # KV in the model's dtype (as transformers keeps it): fp32 models get fp32 pages
    kv_dtype = DType.FLOAT32 if params.embed.dtype is DType.FLOAT32 else DType.BFLOAT16
    base = plan_capacity(cfg, dataclasses.replace(opts, num_pages=1), kv_dtype)
    with device.activate():
        after_weights = memory.snapshot("weights")
        calib = _backend(cfg, params, device, opts, base, 2 * opts.max_concurrency, kv_dtype)
        before_graphs = memory.snapshot("workspace")
        calib.capture_graphs()
        after_graphs = memory.snapshot("graphs")
        calib.destroy_graphs()
        after_destroy = memory.snapshot("graphs destroyed")
        report = memory.GraphMemoryReport(before_graphs, after_graphs, after_destroy)
        workspace_bytes = before_graphs.pool_used_bytes - after_weights.pool_used_bytes
        del calib
        cp.get_default_memory_pool().free_all_blocks()
        now = memory.snapshot("calibrated")
    weights_bytes = after_weights.used_bytes - start.used_bytes
    budget = envs.vram_budget_mib()
    budget_bytes = budget * MIB if budget is not None else now.total_bytes
    engine_used = now.used_bytes - start.used_bytes
    available = (min(now.free_bytes, budget_bytes - engine_used) - HEADROOM_BYTES
                 - workspace_bytes - max(0, report.graph_bytes_estimate))
    page_bytes = PagedKVPool.bytes_per_page(len(cfg.full_attention_layers),
                                            cfg.num_key_value_heads, opts.page_size,
                                            cfg.head_dim, kv_dtype)
    wanted = opts.num_pages or opts.max_concurrency * math.ceil(
        base.max_context_len / opts.page_size)
    num_pages = min(wanted, max(0, available) // page_bytes)
    need = math.ceil(base.max_context_len / opts.page_size)
    if num_pages < min(wanted, need):
        raise InvalidInput(
            f"not enough device memory: {max(0, available) / MIB:.0f} MiB left for KV after "
            f"weights {weights_bytes / MIB:.0f} MiB, workspace {workspace_bytes / MIB:.0f} MiB, "
            f"graphs and 1 GiB headroom; one full context needs {need * page_bytes / MIB:.0f} "
            "MiB (lower --max-context-len or raise NINFER_VRAM_BUDGET_MIB)", param="device")
    plan = dataclasses.replace(base, num_pages=num_pages, kv_bytes=num_pages * page_bytes)
    with device.activate():
        backend = _backend(cfg, params, device, opts, plan, num_pages, kv_dtype)
        backend.capture_graphs()
        final = memory.snapshot("ready")
    lines = [
        f"device plan ({device!r}):",
        f"  weights {weights_bytes / MIB:.0f} MiB, workspace {workspace_bytes / MIB:.0f} MiB, "
        f"state slots {plan.num_slots} x {state_bytes_per_slot(cfg) / MIB:.1f} MiB",
        f"  {report.describe()}",
        f"  KV {num_pages} pages x {opts.page_size} tokens = {plan.kv_bytes / MIB:.0f} MiB "
        f"(bf16), budget {budget_bytes / MIB:.0f} MiB, headroom >= 1024 MiB",
        f"  engine total {(final.used_bytes - start.used_bytes) / MIB:.0f} MiB, "
        f"device free {final.free_bytes / MIB:.0f} MiB",
    ]
    plan = dataclasses.replace(plan, device_report="\n".join(lines))
    log.info(plan.device_report)
    return params, backend, plan
