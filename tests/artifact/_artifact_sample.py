"""A small random artifact with every feature: f32/bf16/int objects, row views, a shared object,
resources, an unbound object."""
from __future__ import annotations

import numpy as np

from ninfer.artifact import Binding, ObjectSpec, ResourceEntry, Use, write_artifact
from ninfer.core.dtypes import DType, f32_to_bf16_bits


def make_objects(seed: int) -> dict[str, tuple[DType, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        "resources/tokenizer.json": (DType.UINT8, np.frombuffer(
            b'{"model": {"type": "BPE"}, "note": "\xc3\xa9"}', dtype=np.uint8)),
        "fused": (DType.FLOAT32, rng.standard_normal((13, 7)).astype(np.float32)),
        "embed": (DType.BFLOAT16, f32_to_bf16_bits(rng.standard_normal((11, 7)))),
        "experts": (DType.BFLOAT16, f32_to_bf16_bits(rng.standard_normal((3, 6, 5)))),
        "ids": (DType.INT32, rng.integers(-100, 100, size=(9,), dtype=np.int32)),
        "unbound": (DType.FLOAT32, rng.standard_normal((4,)).astype(np.float32)),
    }


BINDINGS = [
    Binding("a.weight", "fused", Use.TEXT, (0, 5)),
    Binding("b.weight", "fused", Use.TEXT, (5, 6)),
    Binding("c.weight", "fused", Use.MTP, (6, 13)),
    Binding("embed_tokens.weight", "embed", Use.TEXT),
    Binding("lm_head.weight", "embed", Use.TEXT),
    Binding("experts", "experts", Use.TEXT),
    Binding("visual.ids", "ids", Use.VISION),
]
RESOURCES = [ResourceEntry("tokenizer.json", "resources/tokenizer.json", "application/json")]
CONFIG = {"hidden_size": 7, "nested": {"list": [1, 2.5, None, "x"], "unicode": "\u4f60\u597d"}}
METADATA = {"name": "tiny", "architecture": "Qwen3_5ForCausalLM", "source": {"k": "v"}}


def write_sample(path, seed: int = 0, **overrides):
    objects = make_objects(seed)
    kwargs = dict(config=CONFIG, metadata=METADATA,
                  objects=[ObjectSpec(n, d, a.shape) for n, (d, a) in objects.items()],
                  bindings=BINDINGS, resources=RESOURCES,
                  fill=lambda spec: [objects[spec.name][1]])
    kwargs.update(overrides)
    return write_artifact(path, **kwargs), objects
