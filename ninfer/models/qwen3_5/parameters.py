"""`Parameters`: the read-only, typed weights of one Qwen3.5 text model, bound from an artifact.

Fused projections are one `Weight` whose consecutive row blocks are the logical projections
(`LinearSplit`): the artifact's fused storage groups are used as they are; separately stored
projections are concatenated once at load (a copy of the raw storage, never an fp32 widening).

Placement: `bind_parameters(..., place=fn)` maps every raw storage array through `fn` (identity
on the CPU, keeping the memory map; an upload on CUDA). A parent shared by several bindings (the
tied embedding / lm_head) is placed once.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ninfer.artifact import Artifact
from ninfer.core.dtypes import DType, to_float32
from ninfer.core.tensor import Weight
from ninfer.errors import ArtifactError
from ninfer.models.qwen3_5.config import LayerType, Qwen35Config

Place = Callable[[np.ndarray], object]


@dataclasses.dataclass(frozen=True, slots=True)
class GDNParams:
    in_proj: Weight  # [C + Vd + 2*Hv, H]: rows [qkv | z | b | a]
    conv: Weight  # [C, Kc] depthwise taps; column Kc-1 multiplies the current token
    a_log: Weight  # [Hv]
    dt_bias: Weight  # [Hv]
    norm: Weight  # [dv] gated RMSNorm weight (plain w)
    out_proj: Weight  # [H, Vd]


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionParams:
    qkv_proj: Weight  # [2*A*D + 2*Hkv*D, H]: rows [q/gate interleaved per head | k | v]
    q_norm: Weight  # [D] zero-centred
    k_norm: Weight  # [D] zero-centred
    o_proj: Weight  # [H, A*D]


@dataclasses.dataclass(frozen=True, slots=True)
class DenseMLPParams:
    gate_up: Weight  # [2*I, H]: rows [gate | up]
    down: Weight  # [H, I]


@dataclasses.dataclass(frozen=True, slots=True)
class MoEParams:
    router_gate: Weight  # [E + 1, H]: rows [router (E) | shared-expert gate (1)], one GEMV
    experts_gate_up: Weight  # [E, 2*Im, H]
    experts_down: Weight  # [E, H, Im]
    shared_gate_up: Weight  # [2*Is, H]
    shared_down: Weight  # [H, Is]


@dataclasses.dataclass(frozen=True, slots=True)
class LayerParams:
    kind: LayerType
    input_norm: Weight  # [H] zero-centred
    post_norm: Weight  # [H] zero-centred
    mixer: GDNParams | AttentionParams
    ffn: DenseMLPParams | MoEParams


@dataclasses.dataclass(frozen=True, slots=True)
class Parameters:
    embed: Weight  # [V, H]
    layers: tuple[LayerParams, ...]
    final_norm: Weight  # [H] zero-centred
    lm_head: Weight  # [V, H] (the embedding object itself when tied)


def all_weights(obj) -> list[Weight]:
    """Every Weight inside a parameter dataclass (shared objects appear once per binding)."""
    if isinstance(obj, Weight):
        return [obj]
    if dataclasses.is_dataclass(obj):
        out: list[Weight] = []
        for f in dataclasses.fields(obj):
            out.extend(all_weights(getattr(obj, f.name)))
        return out
    if isinstance(obj, tuple):
        return [w for item in obj for w in all_weights(item)]
    return []


class _Binder:
    """Resolves logical names to placed Weights; places each artifact object once."""

    def __init__(self, artifact: Artifact, place: Place):
        self.artifact = artifact
        self.place = place
        self._placed: dict[str, Weight] = {}

    def _object(self, name: str) -> Weight:
        if name not in self._placed:
            entry = self.artifact.objects[name]
            self._placed[name] = Weight(self.place(self.artifact.object_array(name)), entry.dtype)
        return self._placed[name]

    def weight(self, logical: str, shape: tuple[int, ...] | None = None) -> Weight:
        b = self.artifact.binding(logical)
        w = self._object(b.object)
        if b.rows is not None:
            w = w.rows(*b.rows)
        if shape is not None and tuple(w.shape) != tuple(shape):
            if int(np.prod(w.shape)) == int(np.prod(shape)):
                w = Weight(w.data.reshape(shape), w.dtype)
            else:
                raise ArtifactError(f"parameter {logical!r} has shape {w.shape}, expected {shape}")
        return w

    def fused(self, logicals: list[str], *, widen: bool = False) -> Weight:
        """One Weight whose row blocks are `logicals` in order (a view when stored fused).

        Members of different dtypes raise, or with `widen` are all widened to float32 (exact)."""
        bindings = [self.artifact.binding(n) for n in logicals]
        parent = bindings[0].object
        contiguous = all(b.object == parent and b.rows is not None for b in bindings) and all(
            a.rows[1] == b.rows[0] for a, b in zip(bindings, bindings[1:])
        )
        if contiguous:
            return self._object(parent).rows(bindings[0].rows[0], bindings[-1].rows[1])
        parts = [self.artifact.weight(n) for n in logicals]
        dtypes = {p.dtype for p in parts}
        if len(dtypes) != 1 and widen:
            parts = [Weight(to_float32(np.asarray(p.data), p.dtype), DType.FLOAT32) for p in parts]
        elif len(dtypes) != 1:
            raise ArtifactError(f"projections {logicals} mix dtypes {sorted(d.value for d in dtypes)}")
        raw = np.concatenate([np.asarray(p.data) for p in parts], axis=0)
        return Weight(self.place(raw), parts[0].dtype)


def bind_parameters(artifact: Artifact, cfg: Qwen35Config, place: Place) -> Parameters:
    """Bind and place every text-model parameter named in the artifact."""
    b = _Binder(artifact, place)
    layers = []
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        if kind is LayerType.LINEAR_ATTENTION:
            la = p + "linear_attn."
            mixer: GDNParams | AttentionParams = GDNParams(
                in_proj=b.fused([la + n + ".weight" for n in
                                 ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")]),
                conv=b.weight(la + "conv1d.weight", (cfg.conv_channels, cfg.linear_conv_kernel_dim)),
                a_log=b.weight(la + "A_log"),
                dt_bias=b.weight(la + "dt_bias"),
                norm=b.weight(la + "norm.weight"),
                out_proj=b.weight(la + "out_proj.weight"),
            )
        else:
            sa = p + "self_attn."
            mixer = AttentionParams(
                qkv_proj=b.fused([sa + n + ".weight" for n in ("q_proj", "k_proj", "v_proj")]),
                q_norm=b.weight(sa + "q_norm.weight"),
                k_norm=b.weight(sa + "k_norm.weight"),
                o_proj=b.weight(sa + "o_proj.weight"),
            )
        mlp = p + "mlp."
        if cfg.is_moe:
            ffn: DenseMLPParams | MoEParams = MoEParams(
                router_gate=b.fused([mlp + "gate.weight", mlp + "shared_expert_gate.weight"],
                                    widen=True),
                experts_gate_up=b.weight(mlp + "experts.gate_up_proj"),
                experts_down=b.weight(mlp + "experts.down_proj"),
                shared_gate_up=b.fused([mlp + "shared_expert.gate_proj.weight",
                                        mlp + "shared_expert.up_proj.weight"]),
                shared_down=b.weight(mlp + "shared_expert.down_proj.weight"),
            )
        else:
            ffn = DenseMLPParams(
                gate_up=b.fused([mlp + "gate_proj.weight", mlp + "up_proj.weight"]),
                down=b.weight(mlp + "down_proj.weight"),
            )
        layers.append(LayerParams(
            kind=kind,
            input_norm=b.weight(p + "input_layernorm.weight"),
            post_norm=b.weight(p + "post_attention_layernorm.weight"),
            mixer=mixer,
            ffn=ffn,
        ))
    embed = b.weight("embed_tokens.weight")
    lm_head = b.weight("lm_head.weight") if "lm_head.weight" in artifact.bindings else embed
    return Parameters(embed=embed, layers=tuple(layers), final_norm=b.weight("norm.weight"),
                      lm_head=lm_head)
