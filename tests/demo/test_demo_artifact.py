"""The embedded demo model: built once into a cache dir, reused, rebuilt when damaged, safe to race."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from tools.demo import build_qwen35_tokenizer_json, qwen35_tokenizer_json_path
from tools.demo._filecache import file_sha256
import tools.demo.build as demo_build
from tools.demo.build import DEMO_NAME, demo_chat_template, ensure_demo_artifact

REPO_ROOT = Path(__file__).resolve().parents[2]
# Builds here pin the producer-code part of the recipe key, so that someone editing the converter
# while these tests run cannot change the key between two calls.
_PINNED_CODE_DIGEST = "pinned-for-tests"
_REAL_CODE_DIGEST = demo_build._producer_code_digest
_BUILDER = (
    "import json, sys; import tools.demo.build as b; "
    f"b._producer_code_digest = lambda: {_PINNED_CODE_DIGEST!r}; "
    "r = b.ensure_demo_artifact(cache_dir=sys.argv[1], progress=False); "
    "print(json.dumps({'path': str(r.path), 'built': r.built}))"
)


@pytest.fixture(autouse=True)
def _pin_code_digest(monkeypatch):
    monkeypatch.setattr(demo_build, "_producer_code_digest", lambda: _PINNED_CODE_DIGEST)


def _race_builders(cache_dir: Path, count: int) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-c", _BUILDER, str(cache_dir)], cwd=REPO_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.fixture(scope="module")
def raced(tmp_path_factory):
    """Two processes build the demo concurrently into a fresh cache (tokenizer pre-cached)."""
    cache_dir = tmp_path_factory.mktemp("ninfer-cache")
    qwen35_tokenizer_json_path(cache_dir=cache_dir)  # the slow part, shared with the tokenizer tests
    return cache_dir, _race_builders(cache_dir, 2)


@pytest.fixture(scope="module")
def artifact(raced):
    from ninfer.artifact import Artifact

    _, results = raced
    with Artifact.open(results[0]["path"], verify=True) as art:
        yield art


def test_concurrent_builders_produce_one_valid_artifact(raced):
    cache_dir, results = raced
    assert sorted(r["built"] for r in results) == [False, True]
    assert len({r["path"] for r in results}) == 1
    path = Path(results[0]["path"])
    assert path.parent == cache_dir / "demo" and path.name.startswith(DEMO_NAME) and path.suffix == ".ninfer"
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == [], "no temporaries survive a build"


def test_second_call_reuses_the_cache(raced):
    cache_dir, results = raced
    path = Path(results[0]["path"])
    before = path.stat()
    again = ensure_demo_artifact(cache_dir=cache_dir, progress=False)
    assert again.path == path and again.built is False
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_demo_config_and_resources(artifact):
    cfg = artifact.config
    assert artifact.name == DEMO_NAME
    assert artifact.architecture == "Qwen3_5ForCausalLM"
    assert cfg["vocab_size"] == 248320 and cfg["hidden_size"] == 128 and cfg["num_hidden_layers"] == 4
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 64)
    assert (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]) == (2, 4)
    assert cfg["tie_word_embeddings"] is True
    assert cfg["rope_parameters"]["mrope_section"] == [3, 3, 2]
    assert set(cfg["eos_token_id"]) == {248046, 248044}
    assert artifact.resource("chat_template.jinja").decode("utf-8") == demo_chat_template()
    generation = json.loads(artifact.resource("generation_config.json"))
    assert generation["eos_token_id"] == [248046, 248044]
    embed = artifact.weight("embed_tokens.weight")
    assert tuple(embed.shape) == (248320, 128)


def test_tokenizer_resource_round_trips_text(artifact):
    from tokenizers import Tokenizer

    tokenizer_json = artifact.resource("tokenizer.json").decode("utf-8")
    assert tokenizer_json == build_qwen35_tokenizer_json()
    tok = Tokenizer.from_str(tokenizer_json)
    text = "<|im_start|>user\nHéllo, 世界! 👩‍💻 cafe\u0301\n\tx = 42<|im_end|>\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids[0] == 248045 and 248046 in ids
    assert tok.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_corrupt_cache_entry_is_rebuilt(raced, tmp_path):
    from ninfer.artifact import Artifact

    cache_dir, results = raced
    copy_dir = tmp_path / "cache"
    shutil.copytree(cache_dir, copy_dir)
    path = copy_dir / "demo" / Path(results[0]["path"]).name
    with open(path, "r+b") as f:  # flip one byte in the middle of the payload
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    stale = copy_dir / "demo" / f"{DEMO_NAME}-r0-000000000000.ninfer"  # an older recipe's demo
    stale.write_bytes(b"old")
    rebuilt = ensure_demo_artifact(cache_dir=copy_dir, progress=False)
    assert not stale.exists(), "building a new demo prunes older ones"
    assert rebuilt.built is True and rebuilt.path == path
    assert file_sha256(path) == file_sha256(Path(results[0]["path"])), "the build is reproducible"
    with Artifact.open(path, verify=True) as art:
        assert art.name == DEMO_NAME


def test_default_cache_dir_follows_ninfer_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    path = qwen35_tokenizer_json_path()
    assert path.parent == tmp_path / "demo"
    assert path.read_text(encoding="utf-8") == build_qwen35_tokenizer_json()


def test_recipe_key_covers_the_producer_code(monkeypatch):
    digest = _REAL_CODE_DIGEST()
    assert len(digest) == 64 and digest == _REAL_CODE_DIGEST()
    key = demo_build._demo_key()
    monkeypatch.setattr(demo_build, "_producer_code_digest", lambda: "edited converter")
    assert demo_build._demo_key() != key
