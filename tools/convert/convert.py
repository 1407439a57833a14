"""`convert_checkpoint`: HF Qwen3.5 checkpoint directory -> one `.ninfer` artifact.

Streams tensor by tensor: source tensors are memory-mapped, converted in chunks of at most
`CHUNK_ELEMENTS` elements when the dtype changes (written straight from the map otherwise), and
their pages released after use, so peak memory stays near one chunk, not the checkpoint size.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

import ninfer
from ninfer.artifact import ObjectSpec, ResourceEntry, write_artifact
from ninfer.artifact.progress import ProgressMode
from ninfer.core.dtypes import DType, f32_to_bf16_bits, to_float32
from ninfer.errors import ConversionError
from tools.convert.checkpoint import ConversionWarning, HFCheckpoint
from tools.convert.plan import SOURCE_DTYPES, ConversionPlan, plan_conversion
from tools.convert.resources import collect_resources

CONVERTER_NAME = "ninfer.convert"
CHUNK_ELEMENTS = 4 << 20
_MAX_UNUSED_LISTED = 20


def convert_checkpoint(hf_dir: str | os.PathLike, out_path: str | os.PathLike, *,
                       dtype: str = "keep", name: str | None = None,
                       progress: ProgressMode = True) -> Path:
    """Convert `hf_dir` to `out_path` and return the path.

    dtype: "keep" (bf16/f32 as stored; f16 and mixed fused members widen to f32 exactly),
    "bf16" (round to nearest even) or "fp32". name: `metadata.name` (default: architecture).
    Raises `ConversionError` (one-line message) and leaves no output file on any failure;
    unused checkpoint tensors produce a `ConversionWarning` listing them."""
    out_path = Path(out_path)
    if not out_path.parent.is_dir():
        raise ConversionError(f"output directory {out_path.parent} does not exist")
    if name is not None and not name.strip():
        raise ConversionError("--name must not be empty")
    with HFCheckpoint(hf_dir) as ckpt:
        plan = plan_conversion(ckpt, dtype=dtype)
        resources = collect_resources(ckpt)
        if plan.unused:
            listed = ", ".join(plan.unused[:_MAX_UNUSED_LISTED])
            more = len(plan.unused) - _MAX_UNUSED_LISTED
            warnings.warn(ConversionWarning(
                f"{len(plan.unused)} checkpoint tensor(s) not used by the model: {listed}"
                + (f" (and {more} more)" if more > 0 else "")), stacklevel=2)
        tensor_pieces = {o.spec.name: o.pieces for o in plan.objects}
        resource_data = {r.object_name: r.data for r in resources}

        def fill(spec: ObjectSpec):
            if spec.name in resource_data:
                yield np.frombuffer(resource_data[spec.name], dtype=np.uint8)
                return
            for key in tensor_pieces[spec.name]:
                source = SOURCE_DTYPES[ckpt.info(key).dtype]
                yield from convert_chunks(ckpt.array(key), source, spec.dtype)
                ckpt.release(key)

        return write_artifact(
            out_path, config=plan.stored_config, metadata=_metadata(plan, ckpt, dtype, name),
            objects=[ObjectSpec(r.object_name, DType.UINT8, (len(r.data),)) for r in resources]
            + [o.spec for o in plan.objects],
            bindings=plan.bindings,
            resources=[ResourceEntry(r.name, r.object_name, r.media_type) for r in resources],
            fill=fill, progress=progress, desc="convert")


def convert_chunks(raw: np.ndarray, source: DType, target: DType):
    """Yield `raw` (storage of `source`) re-encoded as `target` storage, flattened, in chunks."""
    flat = raw.reshape(-1)
    if source is target:
        yield flat
        return
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        f32 = to_float32(flat[start:start + CHUNK_ELEMENTS], source)
        if target is DType.FLOAT32:
            yield f32
        elif target is DType.BFLOAT16:
            yield f32_to_bf16_bits(f32)
        else:
            raise ConversionError(f"cannot convert {source.value} to {target.value}")


def _metadata(plan: ConversionPlan, ckpt: HFCheckpoint, policy: str, name: str | None) -> dict:
    return {
        "name": name or plan.config.architecture,
        "architecture": plan.config.architecture,
        "uses": sorted({b.use.value for b in plan.bindings}),
        "source": {
            "format": "huggingface-safetensors",
            "architecture": plan.source_architecture,
            "directory": ckpt.dir.resolve().name,
            "num_tensors": len(ckpt.keys()),
            "dtypes": plan.source_dtypes,
        },
        "converter": {"name": CONVERTER_NAME, "version": ninfer.__version__, "dtype": policy},
    }
