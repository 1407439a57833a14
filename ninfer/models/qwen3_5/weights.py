"""Logical parameters of a Qwen3.5 model and the fused storage groups the converter writes.

Logical names are the HF text names without the `model.language_model.` / `model.` prefix
(`embed_tokens.weight`, `layers.3.self_attn.q_proj.weight`, `layers.0.mlp.experts.gate_up_proj`,
`norm.weight`, `lm_head.weight`); MTP names keep `mtp.`, vision names are `visual.` + the HF name
after `model.visual.`. Shapes follow the HF checkpoint (Linear weights are [out, in]).

Fused groups: one physical parent whose rows are the members, concatenated along axis 0 in the
listed order (each member is a row-range view of the parent):
- GDN    `layers.i.linear_attn.in_proj`        = [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]
- attn   `layers.i.self_attn.qkv_proj`         = [q_proj; k_proj; v_proj]
- dense  `layers.i.mlp.gate_up_proj`           = [gate_proj; up_proj]
- MoE    `layers.i.mlp.shared_expert.gate_up_proj` = [gate_proj; up_proj]
(the same for MTP layers under `mtp.layers.j.`). Routed experts stay HF's fused
`experts.gate_up_proj` [E, 2Im, H] (rows [0:Im] gate, [Im:2Im] up) and `experts.down_proj`
[E, H, Im]. A tied `lm_head.weight` shares the `embed_tokens.weight` object.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from ninfer.artifact.header import Use
from ninfer.models.qwen3_5.config import LayerType, Qwen35Config, Qwen35VisionConfig


@dataclasses.dataclass(frozen=True, slots=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    use: Use

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True, slots=True)
class FusedGroup:
    parent: str
    members: tuple[str, ...]   # logical names, stacked along axis 0 in this order


@dataclasses.dataclass(frozen=True)
class WeightLayout:
    """Everything the model binds: logical params (canonical order), fused groups, tied aliases."""
    params: tuple[ParamSpec, ...]
    groups: tuple[FusedGroup, ...]
    tied: Mapping[str, str]    # logical name -> logical name whose object it shares

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {p.name: p for p in self.params})
        object.__setattr__(self, "_group_of",
                           {m: g for g in self.groups for m in g.members})

    def spec(self, name: str) -> ParamSpec:
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def group_of(self, name: str) -> FusedGroup | None:
        return self._group_of.get(name)

    def parent_shape(self, group: FusedGroup) -> tuple[int, ...]:
        first = self._by_name[group.members[0]].shape
        return (sum(self._by_name[m].shape[0] for m in group.members),) + first[1:]


def weight_layout(cfg: Qwen35Config, *, mtp: bool = False, vision: bool = False) -> WeightLayout:
    """The layout of the text model, plus the MTP layers (`mtp`) and vision tower (`vision`)."""
    params, groups = _text(cfg)
    if mtp:
        if cfg.mtp_num_hidden_layers < 1:
            raise ValueError("config has no MTP layers (mtp_num_hidden_layers = 0)")
        p, g = _mtp(cfg)
        params += p
        groups += g
    if vision:
        if cfg.vision is None:
            raise ValueError("config has no vision_config")
        params += vision_param_specs(cfg.vision)
    tied = {"lm_head.weight": "embed_tokens.weight"} if cfg.tie_word_embeddings else {}
    return WeightLayout(tuple(params), tuple(groups), tied)


def _text(cfg: Qwen35Config) -> tuple[list[ParamSpec], list[FusedGroup]]:
    H, V = cfg.hidden_size, cfg.vocab_size
    params = [ParamSpec("embed_tokens.weight", (V, H), Use.TEXT)]
    groups: list[FusedGroup] = []
    for i, layer_type in enumerate(cfg.layer_types):
        p, g = _decoder_layer(cfg, f"layers.{i}.", layer_type, Use.TEXT)
        params += p
        groups += g
    params += [ParamSpec("norm.weight", (H,), Use.TEXT),
               ParamSpec("lm_head.weight", (V, H), Use.TEXT)]
    return params, groups


def _mtp(cfg: Qwen35Config) -> tuple[list[ParamSpec], list[FusedGroup]]:
    H = cfg.hidden_size
    params = [ParamSpec("mtp.fc.weight", (H, 2 * H), Use.MTP),
              ParamSpec("mtp.pre_fc_norm_embedding.weight", (H,), Use.MTP),
              ParamSpec("mtp.pre_fc_norm_hidden.weight", (H,), Use.MTP)]
    groups: list[FusedGroup] = []
    for j in range(cfg.mtp_num_hidden_layers):
        p, g = _decoder_layer(cfg, f"mtp.layers.{j}.", LayerType.FULL_ATTENTION, Use.MTP)
        params += p
        groups += g
    params.append(ParamSpec("mtp.norm.weight", (H,), Use.MTP))
    return params, groups


def _decoder_layer(cfg: Qwen35Config, prefix: str, layer_type: LayerType,
                   use: Use) -> tuple[list[ParamSpec], list[FusedGroup]]:
    H = cfg.hidden_size
    rows: list[tuple[str, tuple[int, ...]]] = [("input_layernorm.weight", (H,))]
    fused: list[tuple[str, tuple[str, ...]]] = []
    if layer_type is LayerType.LINEAR_ATTENTION:
        C, Vd, Hv = cfg.conv_channels, cfg.linear_value_dim, cfg.linear_num_value_heads
        a = "linear_attn."
        rows += [(a + "in_proj_qkv.weight", (C, H)), (a + "in_proj_z.weight", (Vd, H)),
                 (a + "in_proj_b.weight", (Hv, H)), (a + "in_proj_a.weight", (Hv, H)),
                 (a + "conv1d.weight", (C, 1, cfg.linear_conv_kernel_dim)),
                 (a + "dt_bias", (Hv,)), (a + "A_log", (Hv,)),
                 (a + "norm.weight", (cfg.linear_value_head_dim,)),
                 (a + "out_proj.weight", (H, Vd))]
        fused.append((a + "in_proj", tuple(a + f"in_proj_{x}.weight" for x in "qkv z b a".split())))
    else:
        A, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        a = "self_attn."
        rows += [(a + "q_proj.weight", (2 * A * D, H)), (a + "k_proj.weight", (Hkv * D, H)),
                 (a + "v_proj.weight", (Hkv * D, H)), (a + "o_proj.weight", (H, A * D)),
                 (a + "q_norm.weight", (D,)), (a + "k_norm.weight", (D,))]
        fused.append((a + "qkv_proj", tuple(a + f"{x}_proj.weight" for x in "qkv")))
    rows.append(("post_attention_layernorm.weight", (H,)))
    if cfg.is_moe:
        E, Im, Is = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        rows += [("mlp.gate.weight", (E, H)), ("mlp.experts.gate_up_proj", (E, 2 * Im, H)),
                 ("mlp.experts.down_proj", (E, H, Im)),
                 ("mlp.shared_expert.gate_proj.weight", (Is, H)),
                 ("mlp.shared_expert.up_proj.weight", (Is, H)),
                 ("mlp.shared_expert.down_proj.weight", (H, Is)),
                 ("mlp.shared_expert_gate.weight", (1, H))]
        m = "mlp.shared_expert."
    else:
        I = cfg.intermediate_size
        rows += [("mlp.gate_proj.weight", (I, H)), ("mlp.up_proj.weight", (I, H)),
                 ("mlp.down_proj.weight", (H, I))]
        m = "mlp."
    fused.append((m + "gate_up_proj", (m + "gate_proj.weight", m + "up_proj.weight")))
    params = [ParamSpec(prefix + name, shape, use) for name, shape in rows]
    groups = [FusedGroup(prefix + parent, tuple(prefix + x for x in members))
              for parent, members in fused]
    return params, groups


def vision_param_specs(v: Qwen35VisionConfig) -> list[ParamSpec]:
    """The Qwen3.5 ViT (qwen35-spec §7); every Linear/LayerNorm has a bias."""
    D, M = v.hidden_size, v.hidden_size * v.spatial_merge_size ** 2
    rows: list[tuple[str, tuple[int, ...]]] = [
        ("patch_embed.proj.weight",
         (D, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)),
        ("patch_embed.proj.bias", (D,)),
        ("pos_embed.weight", (v.num_position_embeddings, D)),
    ]
    for i in range(v.depth):
        b = f"blocks.{i}."
        rows += [(b + "norm1.weight", (D,)), (b + "norm1.bias", (D,)),
                 (b + "norm2.weight", (D,)), (b + "norm2.bias", (D,)),
                 (b + "attn.qkv.weight", (3 * D, D)), (b + "attn.qkv.bias", (3 * D,)),
                 (b + "attn.proj.weight", (D, D)), (b + "attn.proj.bias", (D,)),
                 (b + "mlp.linear_fc1.weight", (v.intermediate_size, D)),
                 (b + "mlp.linear_fc1.bias", (v.intermediate_size,)),
                 (b + "mlp.linear_fc2.weight", (D, v.intermediate_size)),
                 (b + "mlp.linear_fc2.bias", (D,))]
    rows += [("merger.norm.weight", (D,)), ("merger.norm.bias", (D,)),
             ("merger.linear_fc1.weight", (M, M)), ("merger.linear_fc1.bias", (M,)),
             ("merger.linear_fc2.weight", (v.out_hidden_size, M)),
             ("merger.linear_fc2.bias", (v.out_hidden_size,))]
    return [ParamSpec("visual." + name, shape, Use.VISION) for name, shape in rows]
