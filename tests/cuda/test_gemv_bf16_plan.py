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
    assert first.name_expressions and all(
        klinear._instance_io(n) & klinear.TMA_IO_RESID_NORM for n in first.name_expressions)
    assert set(first.name_expressions) <= set(klinear.SOURCE_FOLD.name_expressions)
    if klinear.NORM_FOLD_PREFETCH:
        assert klinear.SOURCE_FOLD_PREFETCH is first


def test_x_vec_instances_are_declared_and_chosen_for_several_rows(monkeypatch):
    """NINFER_GEMV_X_VEC: calls of N > 1 rows with a bf16 x in registers take the TMA_IO_X_VEC
    instances (declared for every x stage count, every tile group of x read per stage, and
    every bf16 / fold IO); one row keeps the 4-byte loads, and so does x read per stage unless
    NINFER_GEMV_X_VEC_STAGES; the flag off or x_vec=False never takes them."""
    vec, xb = klinear.TMA_IO_X_VEC, klinear.TMA_IO_X_BF16
    monkeypatch.setattr(klinear, "GEMV_X_VEC", True)
    monkeypatch.setattr(klinear, "GEMV_X_VEC_STAGES", False)
    for io in {io for _, io in klinear.TMA_BF16_IO + klinear.TMA_FOLD_IO}:
        assert klinear.tma_vec_io(io, 4, 8) == io | vec
        assert klinear.tma_vec_io(io, 4, 2) == io | vec
        assert klinear.tma_vec_io(io, 4, 1) == io  # one row: the 4-byte loads
        assert klinear.tma_vec_io(io, 0, 8) == io  # x read per stage
        assert klinear.tma_vec_io(io, 4, 1, x_vec=True) == io | vec
        assert klinear.tma_vec_io(io, 4, 8, x_vec=False) == io
        assert klinear.tma_vec_io(io, 0, 8, x_vec=True) == io | vec
    assert klinear.tma_vec_io(0, 4, 8) == 0  # an f32 x
    monkeypatch.setattr(klinear, "GEMV_X_VEC_STAGES", True)
    assert klinear.tma_vec_io(xb, 0, 8) == xb | vec
    assert klinear.tma_vec_io(xb, 0, 1) == xb
    monkeypatch.setattr(klinear, "GEMV_X_VEC", False)
    assert klinear.tma_vec_io(xb, 4, 8) == xb
    assert klinear.tma_vec_io(xb, 0, 8) == xb
    for source, ios in (("SOURCE", klinear.TMA_BF16_IO), ("SOURCE_FOLD", klinear.TMA_FOLD_IO)):
        declared = set(getattr(klinear, source).name_expressions)
        for swiglu, io in ios:
            for xs, tg in ([(xs, 1) for xs in range(1, klinear.TMA_MAX_X_STAGES + 1)]
                           + [(0, tg) for tg in envs.TMA_TILE_GROUPS]):
                for flags in (io, io | vec):
                    name = f"linear_tma_kernel<{swiglu}, 1024, 16, {xs}, {tg}, {flags}>"
                    assert name in declared, name
    prefetch = klinear.fold_prefetch_source().name_expressions
    assert {klinear._instance_io(n) for n in prefetch} == {
        xb | klinear.TMA_IO_RESID_NORM, xb | klinear.TMA_IO_RESID_NORM | vec}
    assert "-DNORM_FOLD_PREFETCH=4" in klinear.fold_prefetch_source().options


def test_io_flags_include_x_vec():
    assert int(re.search(r"#define TMA_IO_X_VEC (\d+)", SOURCE).group(1)) == klinear.TMA_IO_X_VEC
