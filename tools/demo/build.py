"""The embedded demo model: a small random-weight Qwen3.5 with the real tokenizer, built on use.

`demo_artifact_path()` returns `<cache>/demo/ninfer-demo-qwen3.5-r<N>-<key>.ninfer`, building it
the first time (a few seconds): real Qwen3.5 tokenizer.json (cached next to it), our ChatML
template, random bf16 weights written as an HF checkpoint by `ninfer.testing.checkpoints`, then
converted by `tools.convert`. `<key>` digests the whole recipe (config, seed, template,
tokenizer recipe, artifact format version, the source of the packages that write the artifact),
so any change builds a new file. Concurrent callers
serialize on a lock file; a truncated or corrupted entry fails its digest check and is rebuilt
(see `_filecache`). The cache is `ninfer.envs.cache_dir()` (`$NINFER_CACHE_DIR` or
`~/.cache/ninfer`) unless `cache_dir` is given.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.resources
import importlib.util
import json
import os
import sys
from pathlib import Path

from ninfer import envs
from tools.demo._filecache import build_once, discard, temp_sibling
from tools.demo.qwen_tokenizer import (
    build_qwen35_tokenizer_json, special_token_ids, tokenizer_cache_key,
)

__all__ = [
    "DEMO_NAME", "DemoArtifact", "demo_artifact_path", "demo_chat_template",
    "demo_generation_config",
    "demo_text_config", "ensure_demo_artifact", "qwen35_tokenizer_json_path",
]

DEMO_NAME = "ninfer-demo-qwen3.5"
DEMO_SEED = 20260311
# Bump when the build changes in a way the key below cannot see (e.g. how weights are drawn).
RECIPE_VERSION = 1

_IDS = special_token_ids()
_EOT = _IDS["<|endoftext|>"]                               # 248044: bos / pad
_EOS_IDS = [_IDS["<|im_end|>"], _EOT]                      # [248046, 248044]
_TEXT_CONFIG = {
    "vocab_size": 248320, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False,
    "tie_word_embeddings": True, "max_position_embeddings": 32768,
    "rope_parameters": {
        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2], "mrope_interleaved": True,
    },
    "bos_token_id": _EOT, "eos_token_id": _EOS_IDS, "pad_token_id": _EOT,
}
# Small-model defaults: thinking off (see the template), non-thinking sampling from the model card.
_GENERATION_CONFIG = {
    "bos_token_id": _EOT, "eos_token_id": _EOS_IDS, "pad_token_id": _EOT,
    "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
}


def demo_text_config() -> dict:
    """The demo model's HF text config (a fresh copy)."""
    return copy.deepcopy(_TEXT_CONFIG)


def demo_generation_config() -> dict:
    """The demo model's generation_config.json content (a fresh copy)."""
    return copy.deepcopy(_GENERATION_CONFIG)


def demo_chat_template() -> str:
    """ninfer's Qwen3.5 ChatML template (`ninfer/models/common/qwen/chat_template.jinja`)."""
    resource = importlib.resources.files("ninfer.models.common.qwen") / "chat_template.jinja"
    return resource.read_text(encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class DemoArtifact:
    """Where the demo artifact is, and whether this call had to build it."""
    path: Path
    built: bool


def _demo_dir(cache_dir: str | os.PathLike | None) -> Path:
    return (Path(cache_dir).expanduser() if cache_dir is not None else envs.cache_dir()) / "demo"


def qwen35_tokenizer_json_path(*, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached Qwen3.5 tokenizer.json (built from `qwen-tokenizer` ranks if missing)."""
    target = _demo_dir(cache_dir) / f"qwen3.5-tokenizer-{tokenizer_cache_key()}.json"

    def build(tmp: Path) -> None:
        tmp.write_text(build_qwen35_tokenizer_json(), encoding="utf-8")

    build_once(target, build, what="the Qwen3.5 tokenizer")
    return target


# Code that decides the artifact's bytes (files, or directories: all their .py files), relative to
# the `ninfer` and `tools` package roots. Editing it in a checkout rebuilds the demo instead of
# leaving a stale cache entry that the new loader may misread.
_PRODUCER_CODE = {
    "ninfer": ("artifact/format.py", "artifact/header.py", "artifact/writer.py", "core/dtypes.py",
               "models/qwen3_5/config.py", "models/qwen3_5/weights.py", "testing/checkpoints.py"),
    "tools": ("convert",),
}


def _producer_code_digest() -> str:
    digest = hashlib.sha256()
    for package, entries in _PRODUCER_CODE.items():
        root = Path(importlib.util.find_spec(package).origin).parent
        for entry in entries:
            path = root / entry
            for source in sorted(path.glob("*.py")) if path.is_dir() else [path]:
                if source.is_file():
                    digest.update(f"{package}/{source.relative_to(root)}\0".encode())
                    digest.update(source.read_bytes())
    return digest.hexdigest()


def _demo_key() -> str:
    from ninfer.artifact import VERSION

    recipe = {
        "recipe_version": RECIPE_VERSION, "seed": DEMO_SEED, "name": DEMO_NAME,
        "text_config": _TEXT_CONFIG, "generation_config": _GENERATION_CONFIG,
        "chat_template_sha256": hashlib.sha256(demo_chat_template().encode()).hexdigest(),
        "tokenizer": tokenizer_cache_key(), "artifact_version": VERSION,
        "producer_code_sha256": _producer_code_digest(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _build_demo(out: Path, target: Path, cache_dir, progress: bool) -> None:
    from tqdm import tqdm

    from ninfer.artifact import Artifact
    from ninfer.testing.checkpoints import write_hf_checkpoint
    from tools.convert import convert_checkpoint

    if progress:
        print(f"ninfer: building the demo model {DEMO_NAME} (first use) in {target.parent}",
              file=sys.stderr, flush=True)
    with tqdm(total=4, desc="demo model", unit="step", disable=not progress) as steps:
        steps.set_postfix_str("tokenizer")
        tokenizer_json = qwen35_tokenizer_json_path(cache_dir=cache_dir).read_text(encoding="utf-8")
        steps.update()
        # A fixed leaf name keeps the artifact (whose metadata records it) byte-reproducible.
        hf_dir = temp_sibling(target, "hf") / DEMO_NAME
        steps.set_postfix_str("random weights")
        write_hf_checkpoint(
            hf_dir, demo_text_config(), seed=DEMO_SEED, dtype="bfloat16",
            architecture="Qwen3_5ForCausalLM", tokenizer_json=tokenizer_json,
            chat_template=demo_chat_template(), generation_config=demo_generation_config(),
        )
        steps.update()
        steps.set_postfix_str("convert")
        convert_checkpoint(hf_dir, out, dtype="keep", name=DEMO_NAME, progress=progress)
        steps.update()
        steps.set_postfix_str("verify")
        with Artifact.open(out, verify=True) as art:
            if art.name != DEMO_NAME:
                raise RuntimeError(f"the converted demo artifact is named {art.name!r}, "
                                   f"expected {DEMO_NAME!r}")
        steps.update()


def ensure_demo_artifact(*, cache_dir: str | os.PathLike | None = None,
                         progress: bool = True) -> DemoArtifact:
    """Like `demo_artifact_path`, also telling whether this call built the artifact."""
    target = _demo_dir(cache_dir) / f"{DEMO_NAME}-r{RECIPE_VERSION}-{_demo_key()}.ninfer"
    built = build_once(target, lambda out: _build_demo(out, target, cache_dir, progress),
                       what="the demo model")
    if built:  # older recipes' demos would otherwise pile up (80 MB each)
        for old in target.parent.glob(f"{DEMO_NAME}-r*.ninfer"):
            if old != target:
                discard(old)
    return DemoArtifact(target, built)


def demo_artifact_path(*, cache_dir: str | os.PathLike | None = None,
                       progress: bool = True) -> Path:
    """Path of the embedded demo model artifact, built into the cache on first use.

    Safe to call from several processes at once (one builds, the others wait and reuse it).
    `progress` shows a tqdm progress bar on stderr while building.
    """
    return ensure_demo_artifact(cache_dir=cache_dir, progress=progress).path
