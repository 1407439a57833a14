"""Qwen3.5 model shapes for the benchmarks (qwen35-spec section 2.3) and the decode GEMVs they
imply (projections fused as the model binds them: GDN [qkv|z|b|a], attention [q+gate|k|v],
MLP [gate|up])."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    full_attention_layers: int
    heads: int
    kv_heads: int
    key_heads: int     # GDN Hk
    value_heads: int   # GDN Hv
    intermediate: int  # dense SwiGLU width (0 for MoE)
    experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    shared_inter: int = 0
    head_dim: int = 256
    dk: int = 128
    dv: int = 128
    conv: int = 4
    vocab: int = 248_320

    @property
    def gdn_layers(self) -> int:
        return self.layers - self.full_attention_layers

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_heads * self.dk + self.value_heads * self.dv

    def decode_gemvs(self) -> list[tuple[str, int, int]]:
        """(name, M, K) of the per-token projections (weights streamed once per step)."""
        h = self.hidden
        vd = self.value_heads * self.dv
        out = [("gdn in_proj", self.conv_channels + vd + 2 * self.value_heads, h),
               ("gdn out_proj", h, vd),
               ("attn qkv", 2 * self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim, h),
               ("attn o_proj", h, self.heads * self.head_dim)]
        if self.experts:
            out += [("moe router+shared gate", self.experts + 1, h),
                    ("shared expert gate_up", 2 * self.shared_inter, h),
                    ("shared expert down", h, self.shared_inter)]
        else:
            out += [("mlp gate_up", 2 * self.intermediate, h), ("mlp down", h, self.intermediate)]
        out.append(("lm_head", self.vocab, h))
        return out


SHAPES = {
    "qwen3.5-0.8b": ModelShape("qwen3.5-0.8b", 1024, 24, 6, 8, 2, 16, 16, 3584),
    "qwen3.5-9b": ModelShape("qwen3.5-9b", 4096, 32, 8, 16, 4, 16, 32, 12288),
    "qwen3.5-27b": ModelShape("qwen3.5-27b", 5120, 64, 16, 24, 4, 16, 48, 17408),
    "qwen3.5-35b-a3b": ModelShape("qwen3.5-35b-a3b", 2048, 40, 10, 16, 2, 16, 32, 0,
                                  experts=256, top_k=8, moe_inter=512, shared_inter=512),
}
ALIASES = {"0.8b": "qwen3.5-0.8b", "9b": "qwen3.5-9b", "27b": "qwen3.5-27b",
           "35b-a3b": "qwen3.5-35b-a3b"}


def resolve(name: str) -> ModelShape:
    """The shape called `name` (full name or alias such as "9b"); ValueError lists the choices."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose from {', '.join(SHAPES)} "
                         f"(or {', '.join(ALIASES)})")
    return SHAPES[key]
