"""Qwen35Config.from_hf: nested/flat configs, layer_types rules, rope keys, validation; the
weight layout against real checkpoint tensor counts."""
from __future__ import annotations

import copy

import pytest

from ninfer.errors import InvalidInput
from ninfer.models.qwen3_5.config import (
    LayerType, Qwen35Config, normalize_hf_config, text_architecture,
)
from ninfer.models.qwen3_5.weights import weight_layout
from ninfer.testing.checkpoints import TINY_DENSE, TINY_MOE, TINY_MOE_TIED

L, F = LayerType.LINEAR_ATTENTION, LayerType.FULL_ATTENTION


def _flat(base=TINY_DENSE, arch="Qwen3_5ForCausalLM", **over):
    d = copy.deepcopy(base)
    d["architectures"] = [arch]
    d.update(over)
    return d


def test_nested_and_flat_give_the_same_text_config():
    flat = _flat(TINY_MOE, "Qwen3_5MoeForCausalLM")
    text = {k: v for k, v in flat.items() if k != "architectures"}
    nested = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": text,
              "vision_config": {"depth": 2, "hidden_size": 32, "out_hidden_size": 64}}
    a, b = Qwen35Config.from_hf(flat), Qwen35Config.from_hf(nested)
    assert a.is_moe and b.is_moe and b.vision.depth == 2 and a.vision is None
    assert b.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert text_architecture(b.architecture) == a.architecture
    assert (a.num_experts, a.num_experts_per_tok, a.moe_intermediate_size) == (8, 2, 32)
    assert a.layer_types == b.layer_types == (L, F, L, F)


def test_derived_sizes():
    c = Qwen35Config.from_hf(_flat())
    assert (c.linear_key_dim, c.linear_value_dim, c.conv_channels) == (32, 64, 128)
    assert c.rotary_dim == 8 and c.full_attention_layers == (3,)
    assert c.linear_attention_layers == (0, 1, 2) and not c.is_moe


def test_layer_types_read_remapped_or_derived_only_when_absent():
    explicit = Qwen35Config.from_hf(_flat(layer_types=["attention", "mamba", "full_attention",
                                                       "linear_attention"],
                                          full_attention_interval=2))
    assert explicit.layer_types == (F, L, F, L)     # interval ignored when layer_types given
    derived = Qwen35Config.from_hf(_flat(TINY_MOE_TIED, "Qwen3_5MoeForCausalLM"))
    assert derived.layer_types == (L, F, L, F)      # full_attention_interval = 2
    default = _flat()
    del default["layer_types"]
    default["num_hidden_layers"] = 8
    assert Qwen35Config.from_hf(default).full_attention_layers == (3, 7)


def test_rope_parameters_and_legacy_keys():
    legacy = _flat(rope_theta=5e6, partial_rotary_factor=0.5)
    del legacy["rope_parameters"]
    c = Qwen35Config.from_hf(legacy)
    assert (c.rope.theta, c.rope.partial_rotary_factor, c.rotary_dim) == (5e6, 0.5, 16)
    assert c.rope.mrope_section == (11, 11, 10) and c.rope.mrope_interleaved
    both = _flat(rope_theta=1.0)                      # rope_parameters wins over legacy key
    assert Qwen35Config.from_hf(both).rope.theta == 1e7
    scaling = _flat(rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1], "rope_theta": 3.0})
    del scaling["rope_parameters"]
    assert Qwen35Config.from_hf(scaling).rope.theta == 3.0


def test_normalized_config_is_canonical_and_idempotent():
    raw = _flat(attn_output_gate=True, torch_dtype="bfloat16", full_attention_interval=4)
    norm = normalize_hf_config(raw)
    assert norm["attn_output_gate"] is True                     # unknown keys survive
    assert "torch_dtype" not in norm and "full_attention_interval" not in norm
    assert norm["layer_types"] == [t.value for t in Qwen35Config.from_hf(raw).layer_types]
    assert normalize_hf_config(norm) == norm
    assert Qwen35Config.from_hf(norm) == Qwen35Config.from_hf(raw)


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["LlamaForCausalLM"]}, "unsupported architecture 'LlamaForCausalLM'"),
    ({"hidden_size": 0}, "'hidden_size' must be an integer >= 1"),
    ({"head_dim": "32"}, "'head_dim' must be an integer"),
    ({"linear_num_value_heads": 3}, "must be a multiple of linear_num_key_heads"),
    ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads"),
    ({"layer_types": ["full_attention"] * 3}, "must list 4 layer types"),
    ({"layer_types": ["full_attention"] * 3 + ["moe"]}, "unknown type 'moe'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type 'yarn'"),
    ({"eos_token_id": [1, -2]}, "'eos_token_id'"),
])
def test_bad_configs_raise_clear_errors(change, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace("[", r"\[")):
        Qwen35Config.from_hf(_flat(**change))


def test_missing_fields_and_moe_checks():
    d = _flat()
    del d["intermediate_size"]
    with pytest.raises(InvalidInput, match="missing required field 'intermediate_size'"):
        Qwen35Config.from_hf(d)
    with pytest.raises(InvalidInput, match="num_experts_per_tok 9 exceeds num_experts 8"):
        Qwen35Config.from_hf(_flat(TINY_MOE, "Qwen3_5MoeForCausalLM", num_experts_per_tok=9))
    no_arch = {k: v for k, v in _flat().items() if k != "architectures"}
    no_arch["model_type"] = "qwen3_5_text"
    assert Qwen35Config.from_hf(no_arch).architecture == "Qwen3_5ForCausalLM"
    no_arch["model_type"] = "llama"
    with pytest.raises(InvalidInput, match="not a Qwen3.5 type"):
        Qwen35Config.from_hf(no_arch)


REAL_27B = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": dict(
    vocab_size=248320, hidden_size=5120, num_hidden_layers=64, num_attention_heads=24,
    num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    intermediate_size=17408, mtp_num_hidden_layers=1), "vision_config": {"out_hidden_size": 5120}}
REAL_35B_A3B = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": dict(
    vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
    num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256,
    num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512)}


def test_layout_matches_real_checkpoint_manifests():
    # qwen35-spec §3.2: the 27B checkpoint has 1,199 tensors / 27.78 B parameters (with vision
    # and MTP); the 35B-A3B manifest lists 693 text tensors.
    big = weight_layout(Qwen35Config.from_hf(REAL_27B), mtp=True, vision=True)
    assert len(big.params) == 1199
    assert round(sum(p.numel for p in big.params) / 1e9, 2) == 27.78
    moe = weight_layout(Qwen35Config.from_hf(REAL_35B_A3B))
    assert len(moe.params) == 693
    assert moe.spec("layers.0.mlp.experts.gate_up_proj").shape == (256, 1024, 2048)
    assert moe.spec("layers.3.self_attn.q_proj.weight").shape == (8192, 2048)
    assert moe.spec("layers.0.linear_attn.in_proj_qkv.weight").shape == (8192, 2048)


def test_fused_groups_are_row_stacks_of_their_members():
    layout = weight_layout(Qwen35Config.from_hf(_flat(TINY_MOE, "Qwen3_5MoeForCausalLM")),
                           mtp=True)
    parents = {g.parent: g.members for g in layout.groups}
    assert parents["layers.0.linear_attn.in_proj"] == tuple(
        f"layers.0.linear_attn.in_proj_{x}.weight" for x in ("qkv", "z", "b", "a"))
    assert parents["layers.1.self_attn.qkv_proj"] == tuple(
        f"layers.1.self_attn.{x}_proj.weight" for x in "qkv")
    assert "mtp.layers.0.mlp.shared_expert.gate_up_proj" in parents
    assert layout.parent_shape(layout.group_of("layers.0.linear_attn.in_proj_b.weight")) == (
        128 + 64 + 4 + 4, 64)
    assert layout.tied == {}
    tied = weight_layout(Qwen35Config.from_hf(_flat(TINY_MOE_TIED, "Qwen3_5MoeForCausalLM")))
    assert tied.tied == {"lm_head.weight": "embed_tokens.weight"}
