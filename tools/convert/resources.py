"""Frontend resources copied from an HF checkpoint directory into the artifact."""
from __future__ import annotations

import dataclasses
import json
import warnings

from ninfer.errors import ConversionError
from tools.convert.checkpoint import ConversionWarning, HFCheckpoint

RESOURCE_OBJECT_PREFIX = "resources/"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceFile:
    name: str
    media_type: str
    data: bytes

    @property
    def object_name(self) -> str:
        return RESOURCE_OBJECT_PREFIX + self.name


def collect_resources(ckpt: HFCheckpoint) -> list[ResourceFile]:
    """tokenizer.json, tokenizer_config.json, the chat template and generation_config.json.

    The chat template is `chat_template.jinja` if present, else the (default) `chat_template`
    of tokenizer_config.json. Missing files are skipped with a warning for the tokenizer."""
    out = []
    tokenizer = ckpt.read_bytes(TOKENIZER)
    if tokenizer is None:
        warnings.warn(ConversionWarning(f"no {TOKENIZER} in {ckpt.dir}; the artifact will have "
                                        f"no tokenizer"), stacklevel=3)
    else:
        _check_json(ckpt, TOKENIZER, tokenizer)
        out.append(ResourceFile(TOKENIZER, "application/json", tokenizer))
    tok_config = ckpt.read_json(TOKENIZER_CONFIG)
    if tok_config is not None:
        out.append(ResourceFile(TOKENIZER_CONFIG, "application/json",
                                ckpt.read_bytes(TOKENIZER_CONFIG)))
    template = ckpt.read_bytes(CHAT_TEMPLATE)
    if template is None and tok_config is not None:
        template = _template_from_tokenizer_config(ckpt, tok_config)
    if template is not None:
        out.append(ResourceFile(CHAT_TEMPLATE, "text/x-jinja2", template))
    if ckpt.read_json(GENERATION_CONFIG) is not None:
        out.append(ResourceFile(GENERATION_CONFIG, "application/json",
                                ckpt.read_bytes(GENERATION_CONFIG)))
    return out


def _check_json(ckpt: HFCheckpoint, name: str, raw: bytes) -> None:
    try:
        json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{ckpt.dir / name} is not valid JSON ({exc})") from None


def _template_from_tokenizer_config(ckpt: HFCheckpoint, tok_config: dict) -> bytes | None:
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}], pick "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None:
        return None
    if not isinstance(template, str):
        raise ConversionError(f"{ckpt.dir / TOKENIZER_CONFIG}: chat_template must be a string")
    return template.encode("utf-8")
