"""The bf16-x GEMV's plan (linear.py; no GPU): the IO flags mirror linear.cu, every
linear_tma_kernel instance a bf16-operand launch can ask for is declared, and a bf16 x keeps its
fragments in registers up to 5 stages unless NINFER_GEMV_TMA_X_STAGES turns that off."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninfer import envs
from ninfer.kernels_cuda import linear as klinear

SOURCE = (Path(klinear.__file__).parent / "linear.cu").read_text()


def test_io_flags_mirror_linear_cu():
    for name, value in (("TMA_IO_X_BF16", klinear.TMA_IO_X_BF16),
                        ("TMA_IO_OUT_BF16", klinear.TMA_IO_OUT_BF16),
                        ("TMA_IO_RESID_NORM", klinear.TMA_IO_RESID_NORM),
                        ("TMA_IO_ROW_NORM", klinear.TMA_IO_ROW_NORM),
                        ("NORM_FOLD_MAX_PARTS", klinear.NORM_FOLD_MAX_PARTS)):
        assert int(re.search(rf"#define {name} (\d+)", SOURCE).group(1)) == value


@pytest.mark.parametrize("x_stages", envs.TMA_X_STAGES)
def test_x_stages_for_a_bf16_x(monkeypatch, x_stages):
    monkeypatch.setattr(klinear, "TMA_X_STAGES", x_stages)
    for k in (16, 1024, 2048, 4096, 5120, 6144, 12288):
        stages = -(-k // 1024)
        f32 = klinear.tma_x_stages(k, 1024, 16)
        bf16 = klinear.tma_x_stages(k, 1024, 16, bf16_x=True)
        assert f32 == (stages if stages <= x_stages else 0)
        assert bf16 == (stages if x_stages and stages <= klinear.TMA_MAX_X_STAGES else 0)
        # other geometries have no instances with x in registers
        assert klinear.tma_x_stages(k, 2048, 16, bf16_x=True) == 0
        assert klinear.tma_x_stages(k, 1024, 8, bf16_x=True) == 0


@pytest.mark.parametrize("tile_group", envs.TMA_TILE_GROUPS)
@pytest.mark.parametrize("source, ios", [("SOURCE", "TMA_BF16_IO"),
                                         ("SOURCE_FOLD", "TMA_FOLD_IO")])
def test_every_bf16_instance_is_declared(monkeypatch, tile_group, source, ios):
    """What `_launch_tma(..., io=)` names for any K, with x in registers or not, is in SOURCE
    (the norm fold's IO flags: in SOURCE_FOLD, their own build)."""
    monkeypatch.setattr(klinear, "TMA_X_STAGES", klinear.TMA_MAX_X_STAGES)
    declared = set(getattr(klinear, source).name_expressions)
    for swiglu, io in getattr(klinear, ios):
        for k in (16, 1024, 3072, 5120, 6144, 12288):
            for x_regs in (True, False):
                xs = klinear.tma_x_stages(k, 1024, 16, bf16_x=True) if x_regs else 0
                tg = 1 if xs else tile_group
                name = f"linear_tma_kernel<{swiglu}, 1024, 16, {xs}, {tg}, {io}>"
                assert name in declared, name


def test_the_prefetch_build_is_one_source():
    """KernelSource hashes by identity, so the loader keeps one module per object: the norm
    fold's prefetch build, chosen per launch, must be the same object every time (a new one per
    launch loaded the module again at every launch)."""
    first = klinear.fold_prefetch_source()
    assert klinear.fold_prefetch_source() is first
    assert "-DNORM_FOLD_PREFETCH=4" in first.options
    resid = f", {klinear.TMA_IO_X_BF16 | klinear.TMA_IO_RESID_NORM}>"
    assert first.name_expressions and all(n.endswith(resid) for n in first.name_expressions)
    assert set(first.name_expressions) <= set(klinear.SOURCE_FOLD.name_expressions)
    if klinear.NORM_FOLD_PREFETCH:
        assert klinear.SOURCE_FOLD_PREFETCH is first
