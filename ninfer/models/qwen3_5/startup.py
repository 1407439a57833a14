"""Start-up of a Qwen3.5 model instance: read the artifact, bind parameters, plan capacity,
build the backend and the Program.

The capacity plan is explicit: KV pages and StateImage slots are sized before any request is
accepted. On the CPU the KV page count defaults to what `max_concurrency` sequences of the full
context need, capped by a host KV budget.
"""
from __future__ import annotations

import dataclasses
import math

from ninfer import envs
from ninfer.artifact import Artifact
from ninfer.core.dtypes import DType
from ninfer.errors import InvalidInput
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.parameters import Parameters, bind_parameters
from ninfer.models.qwen3_5.program import Qwen35Program
from ninfer.runtime.contract import ProgramLimits

DEFAULT_CPU_KV_MIB = 2048
DEFAULT_HOST_SNAPSHOT_MIB = 1024
MIB = 1 << 20


# Prompt tokens per prefill step. On CUDA a 1024-token chunk keeps the GEMMs large (a 9B chunk
# of 1024 tokens runs at 0.56 of the matmul rate, 512 at 0.51), and chunks that run eagerly
# (partial chunks, MoE models) cost 30-60 ms of host launching whatever their size, about the GPU
# time of 1024 tokens. The CPU is compute-bound at any size; small chunks keep the decode rows of
# other requests from waiting long behind a prompt.
DEFAULT_PREFILL_CHUNK = {"cpu": 128, "cuda": 1024}


@dataclasses.dataclass(frozen=True)
class ProgramOptions:
    """Start-up choices of one model instance (resolved values, see `resolve`)."""

    device: str = "cpu"
    max_concurrency: int = 4
    max_context_len: int | None = None  # None: the model's max_position_embeddings
    page_size: int = 16
    prefill_chunk: int | None = None  # None: DEFAULT_PREFILL_CHUNK of the device
    num_pages: int | None = None  # None: from the KV memory budget
    kv_memory_mib: int | None = None
    host_snapshot_mib: int | None = None
    num_slots: int | None = None  # None: max_concurrency (+1 for a protected resume)
    # CUDA: prefill GEMMs whose per-row results do not depend on the chunk's row count (our
    # GEMV kernels instead of cuBLAS): chunked and whole prefill then give identical tokens,
    # at a prefill-speed cost. The CPU backend is always batch invariant.
    batch_invariant_prefill: bool = False

    def __post_init__(self) -> None:
        if self.prefill_chunk is None:
            object.__setattr__(self, "prefill_chunk",
                               DEFAULT_PREFILL_CHUNK.get(self.device, DEFAULT_PREFILL_CHUNK["cpu"]))
        if not 1 <= self.max_concurrency <= 8:
            raise InvalidInput(f"max_concurrency must be in 1..8, got {self.max_concurrency}",
                               param="max_concurrency")
        for name in ("page_size", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name} must be >= 1", param=name)


@dataclasses.dataclass(frozen=True)
class CapacityPlan:
    max_context_len: int
    page_size: int
    num_pages: int
    num_slots: int
    kv_bytes: int
    state_bytes: int
    host_snapshot_bytes: int
    device_report: str = ""  # the CUDA start-up's memory plan (empty on the CPU)

    def describe(self) -> str:
        if self.device_report:
            return self.device_report
        return (f"capacity: {self.num_pages} KV pages x {self.page_size} tokens "
                f"({self.kv_bytes / MIB:.1f} MiB), {self.num_slots} state slots "
                f"({self.state_bytes / MIB:.1f} MiB), context {self.max_context_len}, "
                f"host snapshots {self.host_snapshot_bytes / MIB:.0f} MiB")


def kv_bytes_per_token(cfg: Qwen35Config, kv_dtype: DType) -> int:
    return (len(cfg.full_attention_layers) * 2 * cfg.num_key_value_heads * cfg.head_dim
            * kv_dtype.itemsize)


def state_bytes_per_slot(cfg: Qwen35Config) -> int:
    conv = (cfg.linear_conv_kernel_dim - 1) * cfg.conv_channels
    rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    return len(cfg.linear_attention_layers) * (conv + rec) * 4


def plan_capacity(cfg: Qwen35Config, opts: ProgramOptions, kv_dtype: DType) -> CapacityPlan:
    context = min(opts.max_context_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    if context < 2:
        raise InvalidInput(f"max_context_len must be >= 2, got {context}", param="max_context_len")
    page_bytes = kv_bytes_per_token(cfg, kv_dtype) * opts.page_size
    if opts.num_pages is not None:
        num_pages = opts.num_pages
    else:
        wanted = opts.max_concurrency * math.ceil(context / opts.page_size)
        budget = (opts.kv_memory_mib or DEFAULT_CPU_KV_MIB) * MIB
        num_pages = max(1, min(wanted, budget // max(page_bytes, 1)))
    slots = opts.num_slots or opts.max_concurrency + 1
    snapshot_mib = opts.host_snapshot_mib
    if snapshot_mib is None:
        snapshot_mib = envs.host_snapshot_budget_mib()
    if snapshot_mib is None:
        snapshot_mib = DEFAULT_HOST_SNAPSHOT_MIB
    return CapacityPlan(
        max_context_len=context, page_size=opts.page_size, num_pages=num_pages, num_slots=slots,
        kv_bytes=num_pages * page_bytes, state_bytes=slots * state_bytes_per_slot(cfg),
        host_snapshot_bytes=snapshot_mib * MIB,
    )


@dataclasses.dataclass
class LoadedModel:
    """A started model: config, parameters, Program, capacity plan (the artifact stays open)."""

    artifact: Artifact
    config: Qwen35Config
    params: Parameters
    program: Qwen35Program
    plan: CapacityPlan


def start_qwen35(artifact: Artifact, opts: ProgramOptions) -> LoadedModel:
    cfg = Qwen35Config.from_hf(artifact.config, architecture=artifact.architecture)
    if opts.device == "cpu":
        from ninfer.models.qwen3_5.cpu_backend import CpuBackend

        kv_dtype = DType.FLOAT32
        plan = plan_capacity(cfg, opts, kv_dtype)
        params = bind_parameters(artifact, cfg, place=lambda a: a)
        backend = CpuBackend(cfg, params, num_pages=plan.num_pages, page_size=plan.page_size,
                             num_slots=plan.num_slots, max_batch=opts.max_concurrency,
                             prefill_chunk=opts.prefill_chunk,
                             max_context_len=plan.max_context_len, kv_dtype=kv_dtype)
    elif opts.device == "cuda":
        from ninfer.models.qwen3_5.cuda_startup import start_cuda_backend

        params, backend, plan = start_cuda_backend(
            cfg, opts, lambda place: bind_parameters(artifact, cfg, place=place))
    else:
        raise InvalidInput(f"unknown device {opts.device!r} (supported: cpu, cuda)",
                           param="device")
    return LoadedModel(artifact, cfg, params, build_program(cfg, opts, plan, backend), plan)


def build_program(cfg: Qwen35Config, opts: ProgramOptions, plan: CapacityPlan,
                  backend) -> Qwen35Program:
    limits = ProgramLimits(
        max_context_len=plan.max_context_len, vocab_size=cfg.vocab_size, page_size=plan.page_size,
        total_pages=plan.num_pages, total_slots=plan.num_slots, max_batch=opts.max_concurrency,
        prefill_chunk=opts.prefill_chunk,
    )
    return Qwen35Program(backend, limits, plan.host_snapshot_bytes)
