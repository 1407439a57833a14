"""Map an HF checkpoint onto the Qwen3.5 weight layout: which source tensors fill which object.

Everything is checked here, before a byte is written: the architecture and config, every tensor
the model needs (present, right shape, a dtype the converter reads). Unused checkpoint tensors
are reported, not fatal.
"""
from __future__ import annotations

import collections
import dataclasses
import re

from ninfer.artifact.header import Binding
from ninfer.artifact.writer import ObjectSpec
from ninfer.core.dtypes import DType
from ninfer.errors import ConversionError, InvalidInput
from ninfer.models.qwen3_5.config import (
    Qwen35Config, normalize_hf_config, text_architecture,
)
from ninfer.models.qwen3_5.weights import ParamSpec, WeightLayout, weight_layout
from tools.convert.checkpoint import HFCheckpoint
from tools.convert.hf_names import (
    CAUSAL_TEXT_PREFIX, CONDITIONAL_TEXT_PREFIX, hf_key, per_expert_keys,
)

SOURCE_DTYPES = {"BF16": DType.BFLOAT16, "F16": DType.FLOAT16, "F32": DType.FLOAT32}
DTYPE_POLICIES = ("keep", "bf16", "fp32")
_MAX_LISTED = 8


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedObject:
    spec: ObjectSpec
    pieces: tuple[str, ...]        # HF keys whose data, concatenated in order, is the object


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
    source_architecture: str
    config: Qwen35Config           # architecture normalized to the CausalLM entry name
    stored_config: dict            # what the artifact header stores
    objects: tuple[PlannedObject, ...]
    bindings: tuple[Binding, ...]
    unused: tuple[str, ...]        # checkpoint keys nothing consumes (sorted)
    source_dtypes: dict[str, int]  # safetensors dtype code -> tensor count (consumed tensors)


def plan_conversion(ckpt: HFCheckpoint, *, dtype: str = "keep") -> ConversionPlan:
    if dtype not in DTYPE_POLICIES:
        raise ConversionError(f"unknown --dtype {dtype!r} (choose from {', '.join(DTYPE_POLICIES)})")
    cfg, stored = _config(ckpt)
    source_arch = cfg.architecture
    keys = ckpt.keys()
    prefix = (CONDITIONAL_TEXT_PREFIX if any(k.startswith(CONDITIONAL_TEXT_PREFIX) for k in keys)
              else CAUSAL_TEXT_PREFIX)
    mtp_layers = cfg.mtp_num_hidden_layers or _count_mtp_layers(keys)
    cfg = dataclasses.replace(cfg, architecture=text_architecture(source_arch),
                              mtp_num_hidden_layers=mtp_layers)
    stored.update(architectures=[cfg.architecture], mtp_num_hidden_layers=mtp_layers)
    has_mtp = mtp_layers > 0 and any(k.startswith("mtp.") for k in keys)
    has_vision = cfg.vision is not None and any(k.startswith("model.visual.") for k in keys)
    layout = weight_layout(cfg, mtp=has_mtp, vision=has_vision)

    sources = {p.name: _find_sources(ckpt, p, prefix, cfg.num_experts)
               for p in layout.params if p.name not in layout.tied}
    _check_sources(ckpt, layout, sources, prefix)
    objects, bindings = _objects_and_bindings(ckpt, layout, sources, dtype)
    consumed = {k for pieces in sources.values() for k in pieces}
    counts = collections.Counter(ckpt.info(k).dtype for k in consumed)
    return ConversionPlan(source_arch, cfg, stored, tuple(objects), tuple(bindings),
                          tuple(sorted(set(keys) - consumed)), dict(sorted(counts.items())))


def _config(ckpt: HFCheckpoint) -> tuple[Qwen35Config, dict]:
    try:
        return Qwen35Config.from_hf(ckpt.config), normalize_hf_config(ckpt.config)
    except InvalidInput as exc:
        raise ConversionError(f"{ckpt.dir / 'config.json'}: {exc}") from None


def _count_mtp_layers(keys: list[str]) -> int:
    found = [int(m.group(1)) for k in keys if (m := re.match(r"mtp\.layers\.(\d+)\.", k))]
    return max(found) + 1 if found else 0


def _find_sources(ckpt: HFCheckpoint, spec: ParamSpec, prefix: str, num_experts: int) -> tuple[str, ...]:
    """HF keys for one logical param: the key itself, or its per-expert pieces; () if absent."""
    key = hf_key(spec.name, text_prefix=prefix)
    if key in ckpt:
        return (key,)
    pieces = per_expert_keys(key, num_experts)
    if pieces and any(p in ckpt for p in pieces):
        return tuple(pieces)
    return ()


def _piece_shape(spec: ParamSpec, n_pieces: int) -> tuple[int, ...]:
    if n_pieces == 1:
        return spec.shape
    per_expert = spec.shape[1:]
    if n_pieces == 2 * spec.shape[0]:          # gate_up: [E, 2Im, H] from [Im, H] pairs
        return (per_expert[0] // 2,) + per_expert[1:]
    return per_expert


def _check_sources(ckpt: HFCheckpoint, layout: WeightLayout, sources: dict, prefix: str) -> None:
    missing, wrong_shape, bad_dtype = [], [], []
    for name, pieces in sources.items():
        spec = layout.spec(name)
        if not pieces:
            missing.append(hf_key(name, text_prefix=prefix))
            continue
        want = _piece_shape(spec, len(pieces))
        for key in pieces:
            if key not in ckpt:
                missing.append(key)
                continue
            info = ckpt.info(key)
            if info.shape != want:
                wrong_shape.append(f"{key} has shape {list(info.shape)}, config implies {list(want)}")
            if info.dtype not in SOURCE_DTYPES:
                bad_dtype.append(f"{key} ({info.dtype})")
    if missing:
        raise ConversionError(f"checkpoint {ckpt.dir} lacks {len(missing)} tensor(s) the model "
                              f"needs: {_listing(missing)}")
    if wrong_shape:
        raise ConversionError(f"shape mismatch against config.json: {_listing(wrong_shape, 3)}")
    if bad_dtype:
        raise ConversionError(f"the converter cannot handle the dtype of {_listing(bad_dtype)} "
                              f"(supported: {', '.join(SOURCE_DTYPES)})")


def _listing(items: list[str], limit: int = _MAX_LISTED) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def _target_dtype(policy: str, source_codes: set[str]) -> DType:
    if policy == "bf16":
        return DType.BFLOAT16
    if policy == "fp32":
        return DType.FLOAT32
    kept = {SOURCE_DTYPES[c] for c in source_codes}
    # The ops take f32 or bf16 weights: f16 widens to f32 exactly, as do mixed fused members.
    return kept.pop() if kept in ({DType.BFLOAT16}, {DType.FLOAT32}) else DType.FLOAT32


def _objects_and_bindings(ckpt, layout: WeightLayout, sources: dict, policy: str):
    objects: list[PlannedObject] = []
    bindings: list[Binding] = []
    emitted: set[str] = set()
    for spec in layout.params:
        if spec.name in layout.tied:
            bindings.append(Binding(spec.name, layout.tied[spec.name], spec.use))
            continue
        group = layout.group_of(spec.name)
        if group is None:
            pieces = sources[spec.name]
            dtype = _target_dtype(policy, {ckpt.info(k).dtype for k in pieces})
            objects.append(PlannedObject(ObjectSpec(spec.name, dtype, spec.shape), pieces))
            bindings.append(Binding(spec.name, spec.name, spec.use))
            continue
        if group.parent in emitted:
            continue
        emitted.add(group.parent)
        pieces = tuple(k for m in group.members for k in sources[m])
        dtype = _target_dtype(policy, {ckpt.info(k).dtype for k in pieces})
        objects.append(PlannedObject(ObjectSpec(group.parent, dtype, layout.parent_shape(group)),
                                     pieces))
        start = 0
        for member in group.members:
            rows = layout.spec(member).shape[0]
            bindings.append(Binding(member, group.parent, layout.spec(member).use,
                                    (start, start + rows)))
            start += rows
    return objects, bindings
