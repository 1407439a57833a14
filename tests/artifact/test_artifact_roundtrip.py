"""Write -> read -> rewrite: values, views, layout rules, byte identity, atomic failure."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from _artifact_sample import BINDINGS, CONFIG, METADATA, make_objects, write_sample

from ninfer.artifact import (
    MAGIC, OBJECT_ALIGNMENT, PAYLOAD_ALIGNMENT, Artifact, Binding, ObjectSpec, Use, copy_artifact,
)
from ninfer.core.dtypes import DType
from ninfer.errors import ArtifactError


def test_read_back_values_views_and_resources(tmp_path):
    path, objects = write_sample(tmp_path / "a.ninfer", seed=7)
    with Artifact.open(path) as art:
        assert art.config == CONFIG and art.metadata == METADATA
        assert art.name == "tiny" and art.architecture == "Qwen3_5ForCausalLM"
        assert list(art.objects) == list(objects)              # payload order = declared order
        for name, (dtype, data) in objects.items():
            arr = art.object_array(name)
            assert arr.dtype == dtype.storage and arr.shape == data.shape
            assert not arr.flags.writeable
            np.testing.assert_array_equal(arr, data)
        fused = objects["fused"][1]
        np.testing.assert_array_equal(art.weight("a.weight").data, fused[0:5])
        np.testing.assert_array_equal(art.weight("b.weight").data, fused[5:6])
        np.testing.assert_array_equal(art.weight("c.weight").data, fused[6:13])
        assert art.weight("c.weight").dtype is DType.FLOAT32
        assert art.binding("c.weight").use is Use.MTP
        assert art.binding_shape("c.weight") == (7, 7)
        # The tied pair is one object: both weights view the same memory.
        e, h = art.weight("embed_tokens.weight"), art.weight("lm_head.weight")
        assert e.dtype is DType.BFLOAT16 and np.shares_memory(e.data, h.data)
        assert art.resource("tokenizer.json") == objects["resources/tokenizer.json"][1].tobytes()
        groups = art.parent_groups()
        assert list(groups) == ["fused"]
        assert [b.name for b in groups["fused"]] == ["a.weight", "b.weight", "c.weight"]
        assert "unbound" not in art.used_objects() and "embed" in art.used_objects()


def test_views_do_not_copy(tmp_path):
    path, _ = write_sample(tmp_path / "a.ninfer")
    with Artifact.open(path) as art:
        parent = art.object_array("fused")
        assert np.shares_memory(art.weight("b.weight").data, parent)
        assert np.shares_memory(art.object_array("fused"), parent)


def test_layout_is_aligned_and_documented(tmp_path):
    path, objects = write_sample(tmp_path / "a.ninfer")
    raw = path.read_bytes()
    assert raw[:8] == MAGIC
    version, flags, header_len, payload_offset, payload_len = struct.unpack("<IIQQQ", raw[8:40])
    assert (version, flags) == (3, 0)
    assert payload_offset % PAYLOAD_ALIGNMENT == 0
    assert len(raw) == payload_offset + payload_len
    header = json.loads(raw[72:72 + header_len])
    assert raw[72 + header_len:payload_offset] == bytes(payload_offset - 72 - header_len)
    for entry in header["objects"]:
        assert entry["offset"] % OBJECT_ALIGNMENT == 0
        start = payload_offset + entry["offset"]
        assert raw[start:start + entry["nbytes"]] == objects[entry["name"]][1].tobytes()
    assert "placement" not in raw[72:72 + header_len].decode() and "device" not in header


def test_rewrite_is_byte_identical(tmp_path):
    path, _ = write_sample(tmp_path / "a.ninfer", seed=3)
    copy = copy_artifact(path, tmp_path / "b.ninfer")
    assert copy.read_bytes() == path.read_bytes()
    again, _ = write_sample(tmp_path / "c.ninfer", seed=3)
    assert again.read_bytes() == path.read_bytes()
    other, _ = write_sample(tmp_path / "d.ninfer", seed=4)
    assert other.read_bytes() != path.read_bytes()


def test_chunked_fill_equals_single_fill(tmp_path):
    _, objects = write_sample(tmp_path / "a.ninfer", seed=5)

    def chunked(spec):
        flat = objects[spec.name][1].reshape(-1)
        for i in range(0, flat.size, 4):
            yield flat[i:i + 4]

    b, _ = write_sample(tmp_path / "b.ninfer", seed=5, fill=chunked)
    assert b.read_bytes() == (tmp_path / "a.ninfer").read_bytes()


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir())


def test_failing_fill_leaves_nothing(tmp_path):
    objects = make_objects(0)

    def boom(spec):
        yield objects[spec.name][1]
        if spec.name == "experts":
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_sample(tmp_path / "a.ninfer", fill=boom)
    assert _leftovers(tmp_path) == []


def test_wrong_byte_count_or_dtype_is_an_error(tmp_path):
    _, objects = write_sample(tmp_path / "ok.ninfer")
    short = lambda spec: [objects[spec.name][1].reshape(-1)[:-1]]  # noqa: E731
    with pytest.raises(ArtifactError, match="expected"):
        write_sample(tmp_path / "a.ninfer", fill=short)
    as_f64 = lambda spec: [objects[spec.name][1].astype(np.float64)]  # noqa: E731
    with pytest.raises(ArtifactError, match="dtype"):
        write_sample(tmp_path / "b.ninfer", fill=as_f64)
    assert _leftovers(tmp_path) == ["ok.ninfer"]


@pytest.mark.parametrize("binding, message", [
    (Binding("x", "missing", Use.TEXT), "unknown object"),
    (Binding("x", "fused", Use.TEXT, (5, 14)), "outside object"),
    (Binding("x", "fused", Use.TEXT, (3, 3)), "outside object"),
])
def test_bad_declarations_fail_before_writing(tmp_path, binding, message):
    with pytest.raises(ArtifactError, match=message):
        write_sample(tmp_path / "a.ninfer", bindings=BINDINGS + [binding])
    assert _leftovers(tmp_path) == []


def test_duplicate_names_and_missing_metadata(tmp_path):
    with pytest.raises(ArtifactError, match="duplicate binding"):
        write_sample(tmp_path / "a.ninfer", bindings=BINDINGS + [BINDINGS[0]])
    with pytest.raises(ArtifactError, match="metadata.name"):
        write_sample(tmp_path / "b.ninfer", metadata={"architecture": "x"})
    objs = [ObjectSpec("x", DType.FLOAT32, (1,))] * 2
    with pytest.raises(ArtifactError, match="duplicate object"):
        write_sample(tmp_path / "c.ninfer", objects=objs, bindings=[], resources=[])
    assert _leftovers(tmp_path) == []


def test_empty_and_zero_size_objects(tmp_path):
    from ninfer.artifact import write_artifact

    p = write_artifact(tmp_path / "e.ninfer", config={}, metadata={"name": "n", "architecture": "a"},
                       objects=[ObjectSpec("z", DType.FLOAT32, (0, 3))],
                       bindings=[Binding("z", "z", Use.TEXT)], resources=[],
                       fill=lambda spec: [])
    with Artifact.open(p) as art:
        assert art.weight("z").shape == (0, 3)
