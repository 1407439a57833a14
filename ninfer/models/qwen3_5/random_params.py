"""Random `Parameters` generated directly on a device (benchmarks at the real Qwen3.5 shapes).

The cost of a step does not depend on the weight values, so benchmarks skip the artifact and
draw bf16 weights on the GPU. Scales keep activations O(1) (1/sqrt(fan_in) for projections,
zero-centred norms near 0, GDN decay parameters in their usual ranges).
"""
from __future__ import annotations

import numpy as np

from ninfer.core.dtypes import DType
from ninfer.core.tensor import Weight
from ninfer.models.qwen3_5.config import LayerType, Qwen35Config
from ninfer.models.qwen3_5.parameters import (
    AttentionParams, DenseMLPParams, GDNParams, LayerParams, MoEParams, Parameters,
)


class _Draw:
    def __init__(self, xp, seed: int, dtype: DType):
        self.xp = xp
        self.rng = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else None
        self.dtype = dtype

    def _normal(self, shape, scale: float, mean: float = 0.0):
        xp = self.xp
        if self.rng is not None:
            x = self.rng.standard_normal(shape, dtype=np.float32)
        else:
            x = xp.random.standard_normal(shape).astype(np.float32)
        return x * np.float32(scale) + np.float32(mean)

    def weight(self, shape, scale: float, mean: float = 0.0) -> Weight:
        x = self._normal(shape, scale, mean)
        if self.dtype is DType.FLOAT32:
            return Weight(x, DType.FLOAT32)
        bits = (x.view(np.uint32) + np.uint32(0x7FFF) + ((x.view(np.uint32) >> 16) & 1)) >> 16
        return Weight(bits.astype(np.uint16), DType.BFLOAT16)

    def linear(self, out_features: int, in_features: int) -> Weight:
        return self.weight((out_features, in_features), in_features ** -0.5)

    def norm(self, n: int) -> Weight:
        return self.weight((n,), 0.05)


def random_parameters(cfg: Qwen35Config, *, xp=np, seed: int = 0,
                      dtype: DType = DType.BFLOAT16) -> Parameters:
    d = _Draw(xp, seed, dtype)
    h = cfg.hidden_size
    layers = []
    for kind in cfg.layer_types:
        if kind is LayerType.LINEAR_ATTENTION:
            hv = cfg.linear_num_value_heads
            mixer: GDNParams | AttentionParams = GDNParams(
                in_proj=d.linear(cfg.conv_channels + cfg.linear_value_dim + 2 * hv, h),
                conv=d.weight((cfg.conv_channels, cfg.linear_conv_kernel_dim), 0.3),
                a_log=d.weight((hv,), 0.5, mean=1.0),
                dt_bias=d.weight((hv,), 0.1, mean=1.0),
                norm=d.weight((cfg.linear_value_dim // hv,), 0.05, mean=1.0),
                out_proj=d.linear(h, cfg.linear_value_dim),
            )
        else:
            a, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            mixer = AttentionParams(qkv_proj=d.linear(2 * a * hd + 2 * kv * hd, h),
                                    q_norm=d.norm(hd), k_norm=d.norm(hd),
                                    o_proj=d.linear(h, a * hd))
        if cfg.is_moe:
            e, im, is_ = (cfg.num_experts, cfg.moe_intermediate_size,
                          cfg.shared_expert_intermediate_size)
            ffn: DenseMLPParams | MoEParams = MoEParams(
                router_gate=d.linear(e + 1, h),
                experts_gate_up=d.weight((e, 2 * im, h), h ** -0.5),
                experts_down=d.weight((e, h, im), im ** -0.5),
                shared_gate_up=d.linear(2 * is_, h), shared_down=d.linear(h, is_))
        else:
            i = cfg.intermediate_size
            ffn = DenseMLPParams(gate_up=d.linear(2 * i, h), down=d.linear(h, i))
        layers.append(LayerParams(kind, d.norm(h), d.norm(h), mixer, ffn))
    embed = d.weight((cfg.vocab_size, h), 1.0)
    lm_head = embed if cfg.tie_word_embeddings else d.linear(cfg.vocab_size, h)
    return Parameters(embed=embed, layers=tuple(layers), final_norm=d.norm(h), lm_head=lm_head)
