"""The module loader on the GPU: every .cu compiles through NVRTC (one test per module, so a
compile error names its file), compile time is recorded, undeclared instances are refused."""
from __future__ import annotations

import pytest

from ninfer.kernels_cuda import _nvcc
from ninfer.kernels_cuda._loader import compile_records, get_function, precompile

pytestmark = pytest.mark.gpu

SOURCES = _nvcc.all_sources()


@pytest.mark.parametrize("source", SOURCES, ids=[s.file for s in SOURCES])
def test_module_compiles_with_nvrtc(source):
    precompile(source)
    for name in source.name_expressions:
        assert get_function(source, name) is not None
    assert any(r.file == source.file and r.seconds >= 0 for r in compile_records())


def test_undeclared_instance_is_refused():
    source = SOURCES[0]
    with pytest.raises(KeyError, match="not an instance declared"):
        get_function(source, "no_such_kernel<float>")
