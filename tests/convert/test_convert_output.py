"""Converter output binds every tensor the model needs, with exactly the source values."""
from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest
from safetensors.numpy import load_file

from ninfer.artifact import Artifact, Use
from ninfer.core.dtypes import DType, bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.models.qwen3_5.config import Qwen35Config, text_architecture
from ninfer.models.qwen3_5.weights import weight_layout
from ninfer.testing.checkpoints import PRESETS, write_hf_checkpoint
from tools.convert import ConversionWarning, convert_checkpoint
from tools.convert.hf_names import (
    CAUSAL_TEXT_PREFIX, CONDITIONAL_TEXT_PREFIX, hf_key, per_expert_keys,
)

CASES = {
    "dense-causal-f32-keep": dict(preset="tiny-dense", arch="Qwen3_5ForCausalLM"),
    "dense-cond-bf16-keep-mtp-visual": dict(
        preset="tiny-dense-tied", arch="Qwen3_5ForConditionalGeneration", ckpt_dtype="bfloat16",
        with_mtp=True, with_visual=True),
    "moe-causal-fused-f32-to-bf16-sharded": dict(
        preset="tiny-moe", arch="Qwen3_5MoeForCausalLM", policy="bf16", shard_bytes=60_000),
    "moe-cond-per-expert-bf16-to-fp32-mtp": dict(
        preset="tiny-moe-tied", arch="Qwen3_5MoeForConditionalGeneration",
        moe_layout="per_expert", ckpt_dtype="bfloat16", policy="fp32", with_mtp=True),
    "moe-cond-per-expert-f32-keep-all": dict(
        preset="tiny-moe", arch="Qwen3_5MoeForConditionalGeneration", moe_layout="per_expert",
        with_mtp=True, with_visual=True, shard_bytes=200_000),
}


def _build(tmp_path, preset, arch, ckpt_dtype="float32", policy="keep", moe_layout="fused",
           with_mtp=False, with_visual=False, shard_bytes=None, seed=5):
    hf = write_hf_checkpoint(tmp_path / "hf", PRESETS[preset], seed=seed, dtype=ckpt_dtype,
                             architecture=arch, moe_layout=moe_layout, with_mtp=with_mtp,
                             with_visual=with_visual, shard_bytes=shard_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionWarning)   # a clean checkpoint warns nothing
        out = convert_checkpoint(hf, tmp_path / "model.ninfer", dtype=policy, progress=False)
    return hf, out


def _source_tensors(hf) -> dict[str, np.ndarray]:
    tensors = {}
    for f in sorted(hf.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _expected(sources, spec, prefix, num_experts) -> np.ndarray:
    """The logical tensor assembled from the HF file(s), as float32."""
    key = hf_key(spec.name, text_prefix=prefix)
    if key in sources:
        raw = sources[key]
    else:
        raw = np.concatenate([sources[k].reshape(-1) for k in per_expert_keys(key, num_experts)])
    raw = raw.reshape(spec.shape)
    return bf16_bits_to_f32(raw) if raw.dtype == np.uint16 else raw.astype(np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_converted_artifact_binds_everything_exactly(tmp_path, case):
    kw = dict(CASES[case])
    hf, out = _build(tmp_path, **kw)
    ckpt_dtype, policy = kw.get("ckpt_dtype", "float32"), kw.get("policy", "keep")
    conditional = kw["arch"].endswith("ConditionalGeneration")
    prefix = CONDITIONAL_TEXT_PREFIX if conditional else CAUSAL_TEXT_PREFIX
    source_cfg = Qwen35Config.from_hf(json.loads((hf / "config.json").read_text()))
    cfg = dataclasses.replace(source_cfg, architecture=text_architecture(kw["arch"]))
    layout = weight_layout(cfg, mtp=kw.get("with_mtp", False), vision=kw.get("with_visual", False))
    sources = _source_tensors(hf)
    want_dtype = {"bf16": DType.BFLOAT16, "fp32": DType.FLOAT32}.get(
        policy, DType.BFLOAT16 if ckpt_dtype == "bfloat16" else DType.FLOAT32)

    with Artifact.open(out) as art:
        assert art.architecture == cfg.architecture == art.name
        assert art.metadata["source"]["architecture"] == kw["arch"]
        assert Qwen35Config.from_hf(art.config) == cfg
        assert set(art.bindings) == {p.name for p in layout.params}     # nothing missing/extra
        for spec in layout.params:
            b = art.binding(spec.name)
            w = art.weight(spec.name)
            assert w.shape == spec.shape and b.use is spec.use and w.dtype is want_dtype, spec.name
            source_spec = layout.spec(layout.tied.get(spec.name, spec.name))
            ref = _expected(sources, source_spec, prefix, cfg.num_experts)
            got = bf16_bits_to_f32(w.data) if w.dtype is DType.BFLOAT16 else np.asarray(w.data)
            if policy == "bf16" and ckpt_dtype == "float32":
                np.testing.assert_array_equal(w.data, f32_to_bf16_bits(ref), err_msg=spec.name)
            else:
                np.testing.assert_array_equal(got, ref, err_msg=spec.name)
        _check_fused_parents(art, layout)
        if cfg.tie_word_embeddings:
            assert art.binding("lm_head.weight").object == art.binding("embed_tokens.weight").object
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                     "chat_template.jinja"):
            assert art.resource(name) == (hf / name).read_bytes()
        uses = {b.use for b in art.bindings.values()}
        assert (Use.MTP in uses) == kw.get("with_mtp", False)
        assert (Use.VISION in uses) == kw.get("with_visual", False)


def _check_fused_parents(art, layout) -> None:
    groups = art.parent_groups()
    assert set(groups) == {g.parent for g in layout.groups}
    for g in layout.groups:
        members = groups[g.parent]
        assert [b.name for b in members] == list(g.members)
        assert members[0].rows[0] == 0
        assert all(a.rows[1] == b.rows[0] for a, b in zip(members, members[1:]))
        assert members[-1].rows[1] == art.objects[g.parent].shape[0]
        parent = art.object_array(g.parent)
        stacked = np.concatenate([art.weight(m).data for m in g.members])
        np.testing.assert_array_equal(stacked, parent)


def test_conversion_is_deterministic(tmp_path):
    hf = write_hf_checkpoint(tmp_path / "hf", PRESETS["tiny-moe"], seed=9,
                             architecture="Qwen3_5MoeForCausalLM")
    a = convert_checkpoint(hf, tmp_path / "a.ninfer", progress=False)
    b = convert_checkpoint(hf, tmp_path / "b.ninfer", progress=False)
    assert a.read_bytes() == b.read_bytes()
    c = convert_checkpoint(hf, tmp_path / "c.ninfer", name="my-model", progress=False)
    with Artifact.open(c) as art:
        assert art.name == "my-model"


def test_fused_and_per_expert_checkpoints_convert_to_the_same_weights(tmp_path):
    outs = []
    for layout in ("fused", "per_expert"):
        hf = write_hf_checkpoint(tmp_path / layout, PRESETS["tiny-moe"], seed=4,
                                 architecture="Qwen3_5MoeForCausalLM", moe_layout=layout)
        outs.append(convert_checkpoint(hf, tmp_path / f"{layout}.ninfer", progress=False))
    with Artifact.open(outs[0]) as a, Artifact.open(outs[1]) as b:
        assert a.header.objects == b.header.objects and a.bindings == b.bindings


def test_unused_tensors_are_warned_and_listed(tmp_path):
    from tools.convert.safetensors import write_safetensors

    hf = write_hf_checkpoint(tmp_path / "hf", PRESETS["tiny-dense"], seed=1)
    extra = np.random.default_rng(0).standard_normal(6).astype(np.float32)
    write_safetensors(hf / "extra.safetensors", [("model.extra.bias", "F32", (6,)),
                                                 ("model.visual.pos_embed.weight", "F32", (0,))],
                      lambda name: [extra] if name == "model.extra.bias" else [])
    # no vision_config in a CausalLM config: visual tensors are unused too
    with pytest.warns(ConversionWarning, match=r"2 checkpoint tensor\(s\).*model\.extra\.bias, "
                                               r"model\.visual\.pos_embed\.weight"):
        out = convert_checkpoint(hf, tmp_path / "m.ninfer", progress=False)
    with Artifact.open(out) as art:
        assert "extra.bias" not in art.bindings and art.metadata["uses"] == ["text"]


def test_conditional_checkpoint_without_visual_or_mtp(tmp_path):
    hf, out = _build(tmp_path, "tiny-dense", "Qwen3_5ForConditionalGeneration")
    with Artifact.open(out) as art:
        assert {b.use for b in art.bindings.values()} == {Use.TEXT}
        assert art.config["vision_config"]["depth"] == 2   # the config still describes it


def test_per_expert_mtp_with_fused_main_layers(tmp_path):
    """Some releases store the MTP layer's experts per expert while the main layers are fused."""
    from tools.convert.safetensors import SafetensorsFile, write_safetensors

    hf = write_hf_checkpoint(tmp_path / "hf", PRESETS["tiny-moe"], seed=6,
                             architecture="Qwen3_5MoeForCausalLM", with_mtp=True)
    fused = convert_checkpoint(hf, tmp_path / "fused.ninfer", progress=False)
    st = SafetensorsFile(hf / "model.safetensors")
    entries = {n: (i.dtype, np.array(st.array(n))) for n, i in st.tensors.items()}
    st.close()
    for key in ("mtp.layers.0.mlp.experts.gate_up_proj", "mtp.layers.0.mlp.experts.down_proj"):
        dtype, value = entries.pop(key)
        pieces = per_expert_keys(key, value.shape[0])
        flat = value.reshape(len(pieces), -1)
        for piece, row in zip(pieces, flat):
            shape = (value.shape[1] // 2, value.shape[2]) if "gate_up" in key else value.shape[1:]
            entries[piece] = (dtype, row.reshape(shape))
    write_safetensors(hf / "model.safetensors",
                      [(n, d, v.shape) for n, (d, v) in entries.items()],
                      lambda n: [entries[n][1]])
    mixed = convert_checkpoint(hf, tmp_path / "mixed.ninfer", progress=False)
    with Artifact.open(fused) as a, Artifact.open(mixed) as b:
        assert a.header.objects == b.header.objects and a.bindings == b.bindings
