"""Our torch-free safetensors reader/writer agrees with the reference `safetensors` package."""
from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ninfer.core.dtypes import f32_to_bf16_bits
from ninfer.errors import ConversionError
from tools.convert.safetensors import SafetensorsFile, write_safetensors


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a.weight": rng.standard_normal((5, 3)).astype(np.float32),
            "b": rng.standard_normal(7).astype(np.float16),
            "c.ids": rng.integers(-9, 9, size=(2, 2, 2)).astype(np.int64),
            "empty": np.zeros((0, 4), np.float32)}


def test_reference_files_read_back_exactly(tmp_path):
    tensors = _tensors(1)
    save_file(tensors, str(tmp_path / "ref.safetensors"))
    st = SafetensorsFile(tmp_path / "ref.safetensors")
    assert set(st.tensors) == set(tensors)
    for name, value in tensors.items():
        got = st.array(name)
        assert got.dtype == value.dtype and not got.flags.writeable
        np.testing.assert_array_equal(got, value)
    st.release("a.weight")                                  # drop pages; still readable after
    np.testing.assert_array_equal(st.array("a.weight"), tensors["a.weight"])
    st.close()


def test_our_files_load_in_the_reference_reader(tmp_path):
    tensors = _tensors(2)
    codes = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("int64"): "I64"}
    bf16 = f32_to_bf16_bits(np.random.default_rng(3).standard_normal((4, 6)))
    entries = [(n, codes[a.dtype], a.shape) for n, a in tensors.items()] + [("h", "BF16", (4, 6))]
    data = dict(tensors, h=bf16)
    path = write_safetensors(tmp_path / "ours.safetensors", entries, lambda n: [data[n]])
    loaded = load_file(str(path))
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)
    st = SafetensorsFile(path)
    assert st.tensors["h"].dtype == "BF16"
    np.testing.assert_array_equal(st.array("h"), bf16)


def test_corrupt_headers(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file(_tensors(4), str(path))
    raw = path.read_bytes()
    path.write_bytes(raw[:4])
    with pytest.raises(ConversionError, match="truncated"):
        SafetensorsFile(path)
    path.write_bytes((10**12).to_bytes(8, "little") + raw[8:])
    with pytest.raises(ConversionError, match="not a safetensors file"):
        SafetensorsFile(path)
    path.write_bytes((5).to_bytes(8, "little") + b"{nope" + raw[13:])
    with pytest.raises(ConversionError, match="not valid JSON"):
        SafetensorsFile(path)
