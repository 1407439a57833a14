"""Qwen3.5 configuration: parse an HF `config.json` (nested or flat) into a frozen `Qwen35Config`.

Rules (qwen35-spec §2):
- `layer_types` is read from the config, legacy names remapped (`mamba` -> `linear_attention`,
  `attention` -> `full_attention`); it is derived from `full_attention_interval` (default 4:
  layer i is full attention iff (i+1) % interval == 0) ONLY when absent.
- RoPE: `rope_parameters` (or legacy `rope_scaling`) wins over legacy top-level `rope_theta` /
  `partial_rotary_factor`; defaults theta 10000, partial factor 0.25, mrope_section [11, 11, 10],
  interleaved.
- MoE-ness follows the architecture name; every MoE layer has routed experts + a shared expert.

Bad configs raise `InvalidInput` with a message naming the field.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from ninfer.errors import InvalidInput

DENSE_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
MOE_ARCHITECTURES = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
ARCHITECTURES = DENSE_ARCHITECTURES + MOE_ARCHITECTURES
_MODEL_TYPE_TO_ARCH = {
    "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}
# Keys folded into canonical fields or meaningless after conversion; never carried over.
_DROPPED_KEYS = frozenset({
    "architectures", "model_type", "text_config", "vision_config", "full_attention_interval",
    "rope_theta", "partial_rotary_factor", "rope_scaling", "rope_parameters", "torch_dtype",
    "dtype", "transformers_version", "_name_or_path", "auto_map",
})
# Integer size fields read as-is from the HF text config (all required, all >= 1).
_SIZE_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
)
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
               "shared_expert_intermediate_size")


class LayerType(str, enum.Enum):
    LINEAR_ATTENTION = "linear_attention"   # Gated DeltaNet
    FULL_ATTENTION = "full_attention"       # gated softmax attention


_LAYER_TYPE_NAMES = {
    "linear_attention": LayerType.LINEAR_ATTENTION, "mamba": LayerType.LINEAR_ATTENTION,
    "full_attention": LayerType.FULL_ATTENTION, "attention": LayerType.FULL_ATTENTION,
}


@dataclasses.dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    mrope_interleaved: bool = True
    rope_type: str = "default"


@dataclasses.dataclass(frozen=True, slots=True)
class Qwen35VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304

    @classmethod
    def from_hf(cls, raw: dict) -> "Qwen35VisionConfig":
        alias = {"num_hidden_layers": "depth", "num_attention_heads": "num_heads"}
        values = {alias.get(k, k): v for k, v in raw.items()}
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in values:
                kw[f.name] = (str(values[f.name]) if f.name == "hidden_act"
                              else _as_int(values[f.name], f"vision_config.{f.name}"))
        return cls(**kw)

    def to_hf(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Qwen35Config:
    """Instance sizes of a Qwen3.5 text model (+ optional vision tower and MTP layers)."""
    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[LayerType, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    intermediate_size: int | None = None          # dense only
    num_experts: int = 0                          # MoE only (0 for dense)
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    mtp_num_hidden_layers: int = 0
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    vision: Qwen35VisionConfig | None = None

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.architecture in MOE_ARCHITECTURES

    @property
    def linear_key_dim(self) -> int:          # Kd = Hk * dk
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:        # Vd = Hv * dv
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_channels(self) -> int:           # C = 2 * Kd + Vd (q, k, v through the conv)
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.FULL_ATTENTION)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.LINEAR_ATTENTION)

    # -- HF interchange ------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, raw: dict, *, architecture: str | None = None) -> "Qwen35Config":
        """Parse a top-level HF config (with nested `text_config`) or a flat text config."""
        return _parse(cls, raw, architecture)

    def to_hf(self) -> dict:
        """The canonical flat HF-style text config (every field explicit); `from_hf` inverts it."""
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": "qwen3_5_moe_text" if self.is_moe else "qwen3_5_text",
            **{f: getattr(self, f) for f in _SIZE_FIELDS},
            "layer_types": [t.value for t in self.layer_types],
            "hidden_act": self.hidden_act, "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "attention_bias": False,
            "rope_parameters": {
                "rope_type": self.rope.rope_type, "rope_theta": self.rope.theta,
                "partial_rotary_factor": self.rope.partial_rotary_factor,
                "mrope_section": list(self.rope.mrope_section),
                "mrope_interleaved": self.rope.mrope_interleaved,
            },
            "mtp_num_hidden_layers": self.mtp_num_hidden_layers,
            "bos_token_id": self.bos_token_id, "pad_token_id": self.pad_token_id,
            "eos_token_id": (self.eos_token_ids[0] if len(self.eos_token_ids) == 1
                             else list(self.eos_token_ids) or None),
        }
        if self.is_moe:
            out.update({f: getattr(self, f) for f in _MOE_FIELDS})
        else:
            out["intermediate_size"] = self.intermediate_size
        if self.vision is not None:
            out["vision_config"] = self.vision.to_hf()
        return out


def text_architecture(architecture: str) -> str:
    """The text-model entry architecture: `*ForConditionalGeneration` -> `*ForCausalLM`."""
    if architecture not in ARCHITECTURES:
        raise InvalidInput(f"unsupported architecture {architecture!r}")
    return architecture.replace("ForConditionalGeneration", "ForCausalLM")


def normalize_hf_config(raw: dict, *, architecture: str | None = None) -> dict:
    """The config an artifact stores: the canonical `to_hf()` fields plus any other keys of the
    source text config (and top-level multimodal keys such as `image_token_id`), minus legacy
    keys folded into the canonical ones. Idempotent."""
    cfg = Qwen35Config.from_hf(raw, architecture=architecture)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    extras = {k: v for k, v in raw.items() if k not in _DROPPED_KEYS}
    extras.update({k: v for k, v in text.items() if k not in _DROPPED_KEYS})
    return {**extras, **cfg.to_hf()}


def _as_int(value: Any, field: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"config field {field!r} must be an integer >= {minimum}, "
                           f"got {value!r}")
    return value


def _opt_id(value: Any, field: str) -> int | None:
    return None if value is None else _as_int(value, field, 0)


def resolve_layer_types(text: dict, num_layers: int) -> tuple[LayerType, ...]:
    """`layer_types` from the config (legacy names remapped), else from the interval."""
    raw = text.get("layer_types")
    if raw is None:
        interval = _as_int(text.get("full_attention_interval", 4), "full_attention_interval")
        return tuple(LayerType.FULL_ATTENTION if (i + 1) % interval == 0
                     else LayerType.LINEAR_ATTENTION for i in range(num_layers))
    if not isinstance(raw, list) or len(raw) != num_layers:
        raise InvalidInput(f"config field 'layer_types' must list {num_layers} layer types "
                           f"(num_hidden_layers), got {raw!r}")
    try:
        return tuple(_LAYER_TYPE_NAMES[t] for t in raw)
    except (KeyError, TypeError):
        bad = next(t for t in raw if t not in _LAYER_TYPE_NAMES)
        raise InvalidInput(f"config field 'layer_types' has unknown type {bad!r} (known: "
                           f"{', '.join(sorted(_LAYER_TYPE_NAMES))})") from None


def _resolve_architecture(top: dict, override: str | None) -> str:
    if override is not None:
        arch = override
    elif top.get("architectures"):
        archs = top["architectures"]
        arch = archs[0] if isinstance(archs, list) else archs
    else:
        arch = _MODEL_TYPE_TO_ARCH.get(top.get("model_type"))
        if arch is None:
            raise InvalidInput(f"config has no 'architectures' and model_type "
                               f"{top.get('model_type')!r} is not a Qwen3.5 type")
    if arch not in ARCHITECTURES:
        raise InvalidInput(f"unsupported architecture {arch!r} (supported: "
                           f"{', '.join(ARCHITECTURES)})")
    return arch


def _resolve_rope(text: dict) -> RopeConfig:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise InvalidInput(f"config field 'rope_parameters' must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise InvalidInput(f"rope_type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    section = params.get("mrope_section", [11, 11, 10])
    if not (isinstance(theta, (int, float)) and theta > 0):
        raise InvalidInput(f"config field 'rope_theta' must be positive, got {theta!r}")
    if not (isinstance(partial, (int, float)) and 0 < partial <= 1):
        raise InvalidInput(f"config field 'partial_rotary_factor' must be in (0, 1], "
                           f"got {partial!r}")
    if not (isinstance(section, list) and len(section) == 3):
        raise InvalidInput(f"config field 'mrope_section' must be 3 integers, got {section!r}")
    return RopeConfig(theta=float(theta), partial_rotary_factor=float(partial),
                      mrope_section=tuple(_as_int(v, "mrope_section", 0) for v in section),
                      mrope_interleaved=bool(params.get("mrope_interleaved", True)),
                      rope_type="default")


def _parse(cls, raw: dict, architecture: str | None) -> Qwen35Config:
    if not isinstance(raw, dict):
        raise InvalidInput("config must be a JSON object")
    nested = raw.get("text_config")
    text = nested if isinstance(nested, dict) else raw
    arch = _resolve_architecture(raw, architecture)
    moe = arch in MOE_ARCHITECTURES

    def req(key: str, minimum: int = 1) -> int:
        if key not in text:
            raise InvalidInput(f"config is missing required field {key!r}")
        return _as_int(text[key], key, minimum)

    if text.get("attention_bias"):
        raise InvalidInput("attention_bias=true is not supported (Qwen3.5 has no biases)")
    if text.get("hidden_act", "silu") != "silu":
        raise InvalidInput(f"hidden_act {text['hidden_act']!r} is not supported (only 'silu')")
    eos = text.get("eos_token_id", raw.get("eos_token_id"))
    kw: dict[str, Any] = {f: req(f) for f in _SIZE_FIELDS}
    kw.update(
        architecture=arch, layer_types=resolve_layer_types(text, kw["num_hidden_layers"]),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=_as_int(text.get("max_position_embeddings", 32768),
                                         "max_position_embeddings"),
        rope=_resolve_rope(text),
        tie_word_embeddings=bool(text.get("tie_word_embeddings",
                                          raw.get("tie_word_embeddings", False))),
        mtp_num_hidden_layers=_as_int(text.get("mtp_num_hidden_layers", 0),
                                      "mtp_num_hidden_layers", 0),
        bos_token_id=_opt_id(text.get("bos_token_id", raw.get("bos_token_id")), "bos_token_id"),
        pad_token_id=_opt_id(text.get("pad_token_id", raw.get("pad_token_id")), "pad_token_id"),
        eos_token_ids=tuple(_as_int(e, "eos_token_id", 0)
                            for e in (eos if isinstance(eos, list) else [eos] if eos is not None
                                      else [])),
    )
    if moe:
        kw.update({f: req(f) for f in _MOE_FIELDS})
        if kw["num_experts_per_tok"] > kw["num_experts"]:
            raise InvalidInput(f"num_experts_per_tok {kw['num_experts_per_tok']} exceeds "
                               f"num_experts {kw['num_experts']}")
    else:
        kw["intermediate_size"] = req("intermediate_size")
    if kw["linear_num_value_heads"] % kw["linear_num_key_heads"]:
        raise InvalidInput(f"linear_num_value_heads {kw['linear_num_value_heads']} must be a "
                           f"multiple of linear_num_key_heads {kw['linear_num_key_heads']}")
    if kw["num_attention_heads"] % kw["num_key_value_heads"]:
        raise InvalidInput(f"num_attention_heads {kw['num_attention_heads']} must be a multiple "
                           f"of num_key_value_heads {kw['num_key_value_heads']}")
    rotary = int(kw["head_dim"] * kw["rope"].partial_rotary_factor)
    if rotary < 2 or rotary % 2:
        raise InvalidInput(f"rotary dim head_dim*partial_rotary_factor = {rotary} must be even "
                           f"and >= 2")
    vision = raw.get("vision_config")
    if isinstance(vision, dict):
        kw["vision"] = Qwen35VisionConfig.from_hf(vision)
    return cls(**kw)
