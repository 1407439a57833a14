"""cuda_testutil.launch_names (the launch spy of the MoE GPU tests), on the CPU: it records the
`name` of each spied call in order, passes calls through, covers only the attributes a module
has, and restores the originals on exit, also when the block raises."""
from __future__ import annotations

import types

import pytest
from cuda_testutil import launch_names


def _module():
    calls = []
    mod = types.SimpleNamespace(calls=calls)
    mod.launch = lambda *a, **kw: calls.append(("launch", a, kw)) or len(calls)
    mod.launch_dependent = lambda *a, **kw: calls.append(("dependent", a, kw)) or -len(calls)
    return mod


def test_records_names_in_order_and_restores():
    a, b = _module(), types.SimpleNamespace(launch=lambda *x, **kw: "b")
    real_a, real_b, real_dep = a.launch, b.launch, a.launch_dependent
    with launch_names(a, b, attrs=("launch", "launch_dependent")) as names:
        assert a.launch(1, name="k1") == 1           # passed through, result returned
        assert b.launch(name="k2") == "b"
        assert a.launch_dependent(2, name="k3") == -2
        a.launch(3)                                  # no name keyword: None
        assert names == ["k1", "k2", "k3", None]
        assert not hasattr(b, "launch_dependent")   # only attributes the module has
    assert (a.launch, b.launch, a.launch_dependent) == (real_a, real_b, real_dep)
    assert [c[0] for c in a.calls] == ["launch", "dependent", "launch"]


def test_restores_when_the_block_raises():
    a = _module()
    real = a.launch
    with pytest.raises(RuntimeError), launch_names(a) as names:
        a.launch(name="x")
        raise RuntimeError("boom")
    assert a.launch is real and names == ["x"]
