"""Random HF-format Qwen3.5 checkpoints for tests and the demo model.

`write_hf_checkpoint` writes config.json (loadable by transformers 5.x), safetensors (our own
writer, optionally sharded with an index), tokenizer.json / tokenizer_config.json /
chat_template.jinja and generation_config.json. Every tensor is a deterministic function of
`(seed, logical name)`, so the same seed gives the same values in every layout (CausalLM or
ConditionalGeneration keys, fused or per-expert MoE, sharded or not). Scales keep logits O(1):
Linear weights ~ N(0, 1/fan_in), "1+w" norm weights ~ N(0, 0.1), the GDN norm ~ 1 + N(0, 0.1),
A_log = log U(1, 16), dt_bias ~ 1 + N(0, 0.1).
"""
from __future__ import annotations

import functools
import json
import math
import zlib
from pathlib import Path

import numpy as np

from ninfer.core.dtypes import f32_to_bf16_bits
from ninfer.errors import InvalidInput
from ninfer.models.qwen3_5.config import ARCHITECTURES, MOE_ARCHITECTURES, Qwen35Config
from ninfer.models.qwen3_5.weights import ParamSpec, weight_layout
from ninfer.testing.tiny_tokenizer import (
    build_tiny_tokenizer_json, num_token_ids, special_token_ids,
)
from tools.convert.hf_names import (
    CAUSAL_TEXT_PREFIX, CONDITIONAL_TEXT_PREFIX, hf_key, per_expert_keys,
)
from tools.convert.safetensors import write_safetensors

_ROPE = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
         "mrope_section": [2, 1, 1], "mrope_interleaved": True}
_COMMON = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
               linear_conv_kernel_dim=4, hidden_act="silu", rms_norm_eps=1e-6,
               max_position_embeddings=4096, rope_parameters=_ROPE, mtp_num_hidden_layers=1)
_LIN, _FULL = "linear_attention", "full_attention"

#: dense, untied, the real layer pattern (3 GDN + 1 attention), Hv/Hk = 2.
TINY_DENSE = dict(_COMMON, intermediate_size=128, tie_word_embeddings=False,
                  layer_types=[_LIN, _LIN, _LIN, _FULL])
#: dense, tied embeddings, attention first and last, Hv/Hk = 3.
TINY_DENSE_TIED = dict(_COMMON, intermediate_size=96, tie_word_embeddings=True,
                       linear_num_value_heads=6, layer_types=[_FULL, _LIN, _LIN, _FULL])
#: MoE, untied, 8 experts top-2, alternating layers.
TINY_MOE = dict(_COMMON, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=48, tie_word_embeddings=False,
                layer_types=[_LIN, _FULL, _LIN, _FULL])
#: MoE, tied, 6 experts top-3, no layer_types (derived from full_attention_interval = 2).
TINY_MOE_TIED = dict({k: v for k, v in _COMMON.items()}, num_experts=6, num_experts_per_tok=3,
                     moe_intermediate_size=24, shared_expert_intermediate_size=40,
                     tie_word_embeddings=True, full_attention_interval=2)
PRESETS = {"tiny-dense": TINY_DENSE, "tiny-dense-tied": TINY_DENSE_TIED, "tiny-moe": TINY_MOE,
           "tiny-moe-tied": TINY_MOE_TIED}

DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def write_hf_checkpoint(out_dir, text_config: dict, *, seed: int, dtype: str = "float32",
                        architecture: str = "Qwen3_5ForCausalLM", moe_layout: str = "fused",
                        with_mtp: bool = False, with_visual: bool = False,
                        tokenizer_json: str | None = None, chat_template: str | None = None,
                        generation_config: dict | None = None,
                        shard_bytes: int | None = None) -> Path:
    """Write a random checkpoint for `text_config` (an HF text config dict) into `out_dir`.

    The MoE-ness of `text_config` must match `architecture`. `with_visual` needs a
    `*ForConditionalGeneration` architecture (a tiny vision tower is added). Token ids missing
    from `text_config` (bos/eos) are taken from the tokenizer's `<|endoftext|>`."""
    _check_args(architecture, dtype, moe_layout, with_visual, shard_bytes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok_json = tokenizer_json or build_tiny_tokenizer_json(text_config["vocab_size"])
    if num_token_ids(tok_json) > text_config["vocab_size"]:
        raise InvalidInput(f"the tokenizer has ids up to {num_token_ids(tok_json) - 1}, beyond "
                           f"vocab_size {text_config['vocab_size']}")
    specials = special_token_ids(tok_json)
    config = _hf_config(text_config, architecture, specials, with_mtp)
    cfg = Qwen35Config.from_hf(config)
    layout = weight_layout(cfg, mtp=with_mtp, vision=with_visual)
    conditional = architecture not in ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
    entries, sources = _plan_tensors(layout, cfg, conditional, moe_layout)
    st_dtype = "F32" if dtype == "float32" else "BF16"

    @functools.lru_cache(maxsize=1)
    def logical(name: str) -> np.ndarray:
        values = _random_tensor(layout.spec(name), seed)
        return values if dtype == "float32" else f32_to_bf16_bits(values)

    def fill(key: str):
        name, index = sources[key]
        data = logical(name)
        yield data if index is None else _expert_piece(data, key, index)

    _write_shards(out, [(k, st_dtype, s) for k, s in entries], fill, shard_bytes)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_frontend(out, tok_json, specials, chat_template, generation_config, config)
    return out


def _check_args(architecture, dtype, moe_layout, with_visual, shard_bytes) -> None:
    if architecture not in ARCHITECTURES:
        raise InvalidInput(f"unknown architecture {architecture!r} (one of {ARCHITECTURES})")
    if dtype not in ("float32", "bfloat16"):
        raise InvalidInput(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if moe_layout not in ("fused", "per_expert"):
        raise InvalidInput(f"moe_layout must be 'fused' or 'per_expert', got {moe_layout!r}")
    if with_visual and architecture.endswith("ForCausalLM"):
        raise InvalidInput("with_visual needs a *ForConditionalGeneration architecture")
    if shard_bytes is not None and shard_bytes <= 0:
        raise InvalidInput("shard_bytes must be positive")


def _hf_config(text_config: dict, architecture: str, specials: dict, with_mtp: bool) -> dict:
    moe = architecture in MOE_ARCHITECTURES
    text = dict(text_config)
    text["model_type"] = "qwen3_5_moe_text" if moe else "qwen3_5_text"
    eos = specials.get("<|endoftext|>")
    if eos is not None:
        text.setdefault("bos_token_id", eos)
        text.setdefault("eos_token_id", eos)
    if with_mtp:
        text["mtp_num_hidden_layers"] = text.get("mtp_num_hidden_layers") or 1
    if architecture.endswith("ForCausalLM"):
        return {"architectures": [architecture], **text}
    vision = {"model_type": "qwen3_5_moe_vision" if moe else "qwen3_5_vision", "depth": 2,
              "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "in_channels": 3,
              "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
              "num_position_embeddings": 16, "out_hidden_size": text["hidden_size"],
              "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": []}
    top = {"architectures": [architecture], "model_type": "qwen3_5_moe" if moe else "qwen3_5",
           "text_config": text, "vision_config": vision,
           "tie_word_embeddings": bool(text.get("tie_word_embeddings", False))}
    for key, token in (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                       ("vision_start_token_id", "<|vision_start|>"),
                       ("vision_end_token_id", "<|vision_end|>")):
        if token in specials:
            top[key] = specials[token]
    return top


def _plan_tensors(layout, cfg, conditional, moe_layout):
    """[(hf key, shape)] in file order and hf key -> (logical name, expert piece index)."""
    prefix = CONDITIONAL_TEXT_PREFIX if conditional else CAUSAL_TEXT_PREFIX
    entries, sources = [], {}
    for spec in layout.params:
        if spec.name in layout.tied:
            continue
        key = hf_key(spec.name, text_prefix=prefix)
        pieces = per_expert_keys(key, cfg.num_experts) if moe_layout == "per_expert" else None
        if not pieces:
            entries.append((key, spec.shape))
            sources[key] = (spec.name, None)
            continue
        per = len(pieces) // cfg.num_experts
        for index, piece in enumerate(pieces):
            rows = spec.shape[1] // per
            entries.append((piece, (rows,) + spec.shape[2:]))
            sources[piece] = (spec.name, index)
    return entries, sources


def _expert_piece(data: np.ndarray, key: str, index: int) -> np.ndarray:
    """Piece `index` of a fused expert tensor, in `per_expert_keys` order."""
    if key.endswith("down_proj.weight"):
        return data[index]
    half = data.shape[1] // 2
    expert, which = divmod(index, 2)
    return data[expert, which * half:(which + 1) * half]


def _random_tensor(spec: ParamSpec, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    name, shape = spec.name, spec.shape

    def normal(std: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    if name.endswith("A_log"):
        return np.log(rng.uniform(1.0, 16.0, size=shape)).astype(np.float32)
    if name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
        return np.float32(1.0) + normal(0.1)
    if name.startswith("visual."):
        if name.endswith(".bias"):
            return normal(0.02)
        if "norm" in name:
            return np.float32(1.0) + normal(0.1)    # LayerNorm: plain weight
        if name.endswith("pos_embed.weight"):
            return normal(0.02)
        return normal(1.0 / math.sqrt(math.prod(shape[1:])))
    if len(shape) == 1:
        return normal(0.1)                  # "1+w" RMSNorm weights (q/k norms, layer norms)
    fan_in = math.prod(shape[1:]) if name.endswith("conv1d.weight") else shape[-1]
    return normal(1.0 / math.sqrt(fan_in))


def _write_shards(out: Path, entries, fill, shard_bytes: int | None) -> None:
    def nbytes(entry) -> int:
        return math.prod(entry[2]) * (4 if entry[1] == "F32" else 2)

    if shard_bytes is None:
        write_safetensors(out / "model.safetensors", entries, fill)
        return
    shards: list[list] = [[]]
    size = 0
    for entry in entries:
        if shards[-1] and size + nbytes(entry) > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes(entry)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(out / name, shard, fill)
        weight_map.update({e[0]: name for e in shard})
    index = {"metadata": {"total_size": sum(nbytes(e) for e in entries)}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_frontend(out: Path, tok_json: str, specials: dict, chat_template: str | None,
                    generation_config: dict | None, config: dict) -> None:
    text = config.get("text_config", config)
    eos = [specials[t] for t in ("<|im_end|>", "<|endoftext|>") if t in specials]
    (out / "tokenizer.json").write_text(tok_json)
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
                  "bos_token": None, "clean_up_tokenization_spaces": False,
                  "model_max_length": text.get("max_position_embeddings", 32768)}
    if "<|im_end|>" in specials:
        tok_config["eos_token"] = "<|im_end|>"
    if "<|endoftext|>" in specials:
        tok_config["pad_token"] = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(chat_template or DEFAULT_CHAT_TEMPLATE)
    if generation_config is None:
        generation_config = {"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95}
        if eos:
            generation_config.update(eos_token_id=eos, bos_token_id=eos[-1], pad_token_id=eos[-1])
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
