"""Corruption is caught: flipped payload bytes (load + `ninfer verify`), header damage,
truncation, garbage files."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from _artifact_sample import write_sample

from ninfer.artifact import Artifact
from ninfer.cli.main import main
from ninfer.errors import ArtifactError, ArtifactIntegrityError


def _object_offset(path, name: str) -> int:
    raw = path.read_bytes()
    header_len, payload_offset = struct.unpack("<QQ", raw[16:32])
    header = json.loads(raw[72:72 + header_len])
    entry = next(o for o in header["objects"] if o["name"] == name)
    return payload_offset + entry["offset"]


def _flip(path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("name", ["fused", "embed", "resources/tokenizer.json"])
def test_flipped_byte_is_caught_by_load(tmp_path, name):
    path, objects = write_sample(tmp_path / "a.ninfer", seed=11)
    nbytes = objects[name][1].nbytes
    _flip(path, _object_offset(path, name) + int(np.random.default_rng(0).integers(nbytes)))
    with pytest.raises(ArtifactIntegrityError) as info:
        Artifact.open(path)
    assert info.value.object_name == name and repr(name) in str(info.value)
    # An explicit opt-out maps it anyway, and the damage is visible.
    with Artifact.open(path, verify=False) as art:
        assert art.object_array(name).tobytes() != objects[name][1].tobytes()


def test_verify_cli_names_the_first_bad_object(tmp_path, capsys):
    path, _ = write_sample(tmp_path / "a.ninfer", seed=12)
    assert main(["verify", str(path)]) == 0
    assert "ok: 6 objects" in capsys.readouterr().out
    _flip(path, _object_offset(path, "experts") + 3)
    _flip(path, _object_offset(path, "unbound") + 1)
    assert main(["verify", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "'experts'" in err and "\n" not in err


def test_unbound_object_damage_only_seen_by_full_verify(tmp_path, capsys):
    path, _ = write_sample(tmp_path / "a.ninfer", seed=13)
    _flip(path, _object_offset(path, "unbound"))
    Artifact.open(path).close()        # load checks only what bindings/resources use
    assert main(["verify", str(path)]) == 1
    assert "'unbound'" in capsys.readouterr().err


def test_header_damage_is_caught(tmp_path):
    path, _ = write_sample(tmp_path / "a.ninfer")
    raw = path.read_bytes()
    at = raw.index(b'"hidden_size":7') + len(b'"hidden_size":')
    _flip(path, at)
    with pytest.raises(ArtifactError, match="header fails its SHA-256"):
        Artifact.open(path, verify=False)


@pytest.mark.parametrize("cut", [10, 100, 5000, -1])
def test_truncated_file(tmp_path, cut):
    path, _ = write_sample(tmp_path / "a.ninfer")
    raw = path.read_bytes()
    path.write_bytes(raw[:cut])
    with pytest.raises(ArtifactError) as info:
        Artifact.open(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_trailing_bytes_and_garbage(tmp_path, capsys):
    path, _ = write_sample(tmp_path / "a.ninfer")
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match="unexpected bytes"):
        Artifact.open(path)
    junk = tmp_path / "junk.ninfer"
    junk.write_bytes(np.random.default_rng(1).bytes(10000))
    with pytest.raises(ArtifactError, match="not a .ninfer artifact"):
        Artifact.open(junk)
    assert main(["inspect", str(junk)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(ArtifactError, match="cannot open"):
        Artifact.open(tmp_path / "absent.ninfer")


def test_unsupported_version(tmp_path):
    path, _ = write_sample(tmp_path / "a.ninfer")
    raw = bytearray(path.read_bytes())
    raw[8:12] = struct.pack("<I", 2)
    path.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match="version 2 is not supported"):
        Artifact.open(path)
