"""Random HF checkpoints: transformers loads them with no missing/unexpected keys and runs a
forward with O(1) logits; determinism; layouts and shards; the tiny tokenizer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ninfer.errors import InvalidInput
from ninfer.testing.checkpoints import PRESETS, write_hf_checkpoint
from ninfer.testing.tiny_tokenizer import SPECIAL_TOKENS, build_tiny_tokenizer_json

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LOAD_CASES = [
    ("tiny-dense", "Qwen3_5ForCausalLM", {}),
    ("tiny-dense-tied", "Qwen3_5ForConditionalGeneration", dict(with_mtp=True, with_visual=True)),
    ("tiny-moe", "Qwen3_5MoeForCausalLM", dict(moe_layout="per_expert", shard_bytes=80_000)),
    ("tiny-moe-tied", "Qwen3_5MoeForConditionalGeneration", dict(dtype="bfloat16", with_mtp=True)),
]


def _causal_cls(arch: str):
    return (transformers.Qwen3_5MoeForCausalLM if "Moe" in arch
            else transformers.Qwen3_5ForCausalLM)


def _load(path, cls):
    model, info = cls.from_pretrained(path, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, problems
    return model.eval()


def _logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("preset, arch, kw", LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_transformers_loads_and_runs(tmp_path, preset, arch, kw):
    path = write_hf_checkpoint(tmp_path / preset, PRESETS[preset], seed=17, architecture=arch, **kw)
    model = _load(path, _causal_cls(arch))
    ids = np.random.default_rng(0).integers(0, PRESETS[preset]["vocab_size"], size=9).tolist()
    logits = _logits(model, ids)
    assert np.isfinite(logits).all()
    assert 0.3 < logits.std() < 3.0 and np.abs(logits).max() < 20


@pytest.mark.parametrize("arch, preset", [("Qwen3_5ForConditionalGeneration", "tiny-dense"),
                                          ("Qwen3_5MoeForConditionalGeneration", "tiny-moe")])
def test_conditional_generation_class_loads_visual_tower(tmp_path, arch, preset):
    path = write_hf_checkpoint(tmp_path / "cg", PRESETS[preset], seed=3, architecture=arch,
                               with_visual=True, moe_layout="per_expert")
    _load(path, getattr(transformers, arch))


def test_layouts_hold_the_same_values(tmp_path):
    """Same seed: fused vs per-expert, CausalLM vs ConditionalGeneration, sharded or not, give
    the same model (bitwise the same loaded weights, the same logits up to float rounding: with
    transformers 5.24 and torch 2.13 on the CPU, two loads of equal weights at other addresses can
    differ in the last bits); another seed gives another model."""
    ids = [5, 77, 300, 12, 498, 1]
    variants = [("Qwen3_5MoeForCausalLM", {}),
                ("Qwen3_5MoeForConditionalGeneration", dict(moe_layout="per_expert")),
                ("Qwen3_5MoeForCausalLM", dict(shard_bytes=50_000))]
    outs, weights = [], []
    for i, (arch, kw) in enumerate(variants):
        p = write_hf_checkpoint(tmp_path / str(i), PRESETS["tiny-moe"], seed=11, architecture=arch,
                                **kw)
        model = _load(p, _causal_cls(arch))
        weights.append(model.state_dict())
        outs.append(_logits(model, ids))
    for sd in weights[1:]:
        assert sd.keys() == weights[0].keys()
        differ = [k for k in sd if not torch.equal(sd[k], weights[0][k])]
        assert not differ, differ[:5]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-5, atol=1e-5)
    other = write_hf_checkpoint(tmp_path / "other", PRESETS["tiny-moe"], seed=12,
                                architecture="Qwen3_5MoeForCausalLM")
    assert not np.allclose(_logits(_load(other, _causal_cls("Qwen3_5MoeForCausalLM")), ids), outs[0])


def test_files_are_deterministic_and_complete(tmp_path):
    a = write_hf_checkpoint(tmp_path / "a", PRESETS["tiny-dense"], seed=5, shard_bytes=100_000)
    b = write_hf_checkpoint(tmp_path / "b", PRESETS["tiny-dense"], seed=5, shard_bytes=100_000)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json", "model.safetensors.index.json"} <= set(names)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    index = json.loads((a / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {n for n in names if n.endswith(".safetensors")}
    auto = transformers.AutoConfig.from_pretrained(a)
    assert auto.model_type == "qwen3_5_text" and auto.layer_types[3] == "full_attention"
    gen = transformers.GenerationConfig.from_pretrained(a)
    assert gen.eos_token_id == [501, 499] and gen.top_k == 20


def test_custom_frontend_files_are_written_verbatim(tmp_path):
    tok = build_tiny_tokenizer_json(600)
    template = "{{ messages[0]['content'] }}"
    gen = {"temperature": 0.6, "eos_token_id": [1, 2]}
    cfg = dict(PRESETS["tiny-dense"], vocab_size=600)
    p = write_hf_checkpoint(tmp_path / "c", cfg, seed=1, tokenizer_json=tok, chat_template=template,
                            generation_config=gen)
    assert (p / "tokenizer.json").read_text() == tok
    assert (p / "chat_template.jinja").read_text() == template
    assert json.loads((p / "generation_config.json").read_text()) == gen
    assert json.loads((p / "config.json").read_text())["eos_token_id"] == 587


def test_bad_arguments(tmp_path):
    with pytest.raises(InvalidInput, match="with_visual"):
        write_hf_checkpoint(tmp_path, PRESETS["tiny-dense"], seed=1, with_visual=True)
    with pytest.raises(InvalidInput, match="moe_layout"):
        write_hf_checkpoint(tmp_path, PRESETS["tiny-dense"], seed=1, moe_layout="split")
    with pytest.raises(InvalidInput, match="unknown architecture"):
        write_hf_checkpoint(tmp_path, PRESETS["tiny-dense"], seed=1, architecture="Llama")
    with pytest.raises(InvalidInput, match="beyond vocab_size 512"):
        write_hf_checkpoint(tmp_path, PRESETS["tiny-dense"], seed=1,
                            tokenizer_json=build_tiny_tokenizer_json(600))


def test_tiny_tokenizer_round_trips_and_fits_the_vocab():
    from tokenizers import Tokenizer

    tok_json = build_tiny_tokenizer_json(512)
    assert tok_json == build_tiny_tokenizer_json(512)
    tok = Tokenizer.from_str(tok_json)
    assert tok.get_vocab_size() == 512
    texts = ["Hello, world! The quick brown fox.", "你好，世界 😀 naïve café",
             "def f(x):\n    return x  \t\n\n", "<|im_start|>user\nhi<|im_end|>\n<think>\n</think>"]
    for text in texts:
        ids = tok.encode(text).ids
        assert max(ids) < 512 and tok.decode(ids, skip_special_tokens=False) == text
    assert len(tok.encode("The quick brown fox").ids) < len("The quick brown fox")  # merges
    specials = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    assert specials == list(range(512 - len(SPECIAL_TOKENS), 512))
    with pytest.raises(InvalidInput, match="too small"):
        build_tiny_tokenizer_json(200)
