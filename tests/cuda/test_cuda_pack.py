"""`_checks.pack` (the fast struct packer every launcher uses) gives exactly the bytes of a zeroed
NumPy record of the params dtype with the fields assigned, for every params struct the kernel
modules declare (no GPU needed)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import ninfer.kernels_cuda as kernels_cuda
from ninfer.kernels_cuda import _checks as C


def _declared_structs():
    for name in kernels_cuda.MODULES:
        module = importlib.import_module(f"ninfer.kernels_cuda.{name}")
        for attr, value in vars(module).items():
            if isinstance(value, np.dtype) and value.fields:
                yield f"{name}.{attr}", value


STRUCTS = list(_declared_structs())


def _reference(dtype, **fields):
    rec = np.zeros(1, dtype=dtype)
    for key, value in fields.items():
        rec[key] = value
    return rec.tobytes()


def test_every_module_declares_params():
    assert len(STRUCTS) >= 12


@pytest.mark.parametrize("label,dtype", STRUCTS, ids=[s[0] for s in STRUCTS])
def test_pack_matches_a_numpy_record(label, dtype):
    rng = np.random.default_rng(abs(hash(label)) % 2**32)
    for _ in range(5):
        fields = {}
        for name, (field, _) in dtype.fields.items():
            if rng.random() < 0.2:
                continue  # left out: must pack as zero
            if field == np.float32:
                fields[name] = float(rng.standard_normal())
            elif field == np.uint64:
                fields[name] = int(rng.integers(0, 2**63))
            elif field == np.int64:
                fields[name] = int(rng.integers(-2**62, 2**62))
            else:
                fields[name] = np.int32(rng.integers(-2**31, 2**31))
        packed = C.pack(dtype, **fields)
        assert packed.shape == (1,) and packed.itemsize == dtype.itemsize
        assert packed.tobytes() == _reference(dtype, **fields)


def test_pack_rejects_an_unknown_field():
    dtype = C.struct(("x", "ptr"), ("n", "i32"))
    with pytest.raises(ValueError, match="nope"):
        C.pack(dtype, x=1, nope=2)
