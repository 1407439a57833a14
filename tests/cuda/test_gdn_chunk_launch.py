"""gdn_chunk_prefill's launch configuration, on the CPU: the NINFER_GDN_CHUNK_* flags, the
precision a model picks, the kernel instance each path and precision picks, and that the shared
memory sizes mirror gdn_chunk.cu's layouts and fit the blocks per SM its __launch_bounds__ ask
for (H100 / H200: 228 KiB per SM, 227 KiB per block, 1 KiB reserved per block)."""
from __future__ import annotations

import pytest

from ninfer import envs
from ninfer.kernels_cuda import gdn_chunk as kchunk
from ninfer.kernels_cuda.gdn_chunk import Precision

TF32, BF16 = Precision.TF32X3, Precision.BF16

SM_SMEM, BLOCK_SMEM_MAX, RESERVED = 228 * 1024, 227 * 1024, 1024


def test_precision_flag(monkeypatch):
    monkeypatch.delenv("NINFER_GDN_CHUNK_PRECISION", raising=False)
    assert envs.gdn_chunk_precision() is None
    for raw, want in (("bf16", "bf16"), ("tf32x3", "tf32x3"), (" BF16 ", "bf16"), ("", None)):
        monkeypatch.setenv("NINFER_GDN_CHUNK_PRECISION", raw)
        assert envs.gdn_chunk_precision() == want, raw
    for raw in ("fp32", "tf32", "1"):
        monkeypatch.setenv("NINFER_GDN_CHUNK_PRECISION", raw)
        with pytest.raises(ValueError):
            envs.gdn_chunk_precision()
    assert {p.value for p in Precision} == set(envs.GDN_CHUNK_PRECISIONS)


@pytest.mark.parametrize("env,weights_bf16,want", [
    (None, True, BF16), (None, False, TF32), ("tf32x3", True, TF32), ("bf16", False, BF16)])
def test_model_precision(monkeypatch, env, weights_bf16, want):
    """bf16 weights pick bf16 products, fp32 weights 3xTF32; the env switch overrides both."""
    monkeypatch.setattr(kchunk, "_ENV_PRECISION", env)
    assert kchunk.model_precision(weights_bf16) is want


def test_precision_accepts_values():
    assert Precision("bf16") is BF16 and Precision(TF32) is TF32
    with pytest.raises(ValueError):
        Precision("fp16")


def _fits(smem: int, blocks: int) -> bool:
    return smem <= BLOCK_SMEM_MAX and blocks * (smem + RESERVED) <= SM_SMEM


@pytest.mark.parametrize("prec,kernel,smem", [
    (TF32, "gdn_chunk_state_kernel<false>", 161280),
    # bf16 strides: W, Q [64][136]; P [64][72]; K [64][132]; U, S, V' [*][cols + 4]
    (BF16, "gdn_chunk_state_kernel<true>", 159232),
])
def test_state_launch(prec, kernel, smem):
    cfg = kchunk.state_launch(prec)
    assert (cfg.kernel, cfg.cols, cfg.smem) == (kernel, 32, smem)
    assert cfg.kernel in kchunk.SOURCE.name_expressions
    assert _fits(cfg.smem, 1)  # __launch_bounds__(256, 1)


def test_state_launch_default_is_tf32x3():
    assert kchunk.state_launch() == kchunk.state_launch(TF32)


@pytest.mark.parametrize("prec,flag,qk,a", [(TF32, "false", 132, 68), (BF16, "true", 136, 72)])
def test_local_smem(prec, flag, qk, a):
    local = kchunk.local_launch(prec)
    assert local.smem == (2 * 64 * qk + 64 * a + 2 * 64) * 4
    assert _fits(local.smem, 2)  # two blocks when the kernel stays <= 128 registers (_nvcc)
    assert local.kernel == f"gdn_chunk_local_kernel<{flag}>"
    assert local.kernel in kchunk.SOURCE.name_expressions


def test_instances():
    """The instances the launchers can pick: no other kernel is compiled."""
    assert set(kchunk.SOURCE.name_expressions) == {
        "gdn_chunk_offsets_kernel", kchunk.LOCAL16.kernel,
        *[kchunk.local_launch(p).kernel for p in Precision],
        *[kchunk.state_launch(p).kernel for p in Precision],
        *[kchunk.localpair_launch(v).kernel for v in (1, 2)],
        *[kchunk.state16_launch(c).kernel for c in (32, 64)]}


@pytest.mark.parametrize("prec", Precision)
def test_strides_conflict_free(prec):
    """The row strides Mma<BF16> documents: 16-byte rows (cp.async); tf32 fragment reads (g, t)
    of QK tiles and (t, g) of K, B tiles; bf16 float2 reads (g, 2t) of QK, A tiles need 8 mod 32,
    (2t, g) reads of K and B tiles 4 mod 16."""
    cols = [prec.col_ld(kchunk.STATE_COLS)]
    assert all(ld % 4 == 0 for ld in (prec.qk_ld, prec.ks_ld, prec.a_ld, *cols))
    if prec is BF16:
        assert prec.qk_ld % 32 == 8 and prec.a_ld % 32 == 8
        assert prec.ks_ld % 16 == 4 and all(ld % 16 == 4 for ld in cols)
    else:
        assert prec.qk_ld % 32 == 4 and prec.ks_ld % 32 == 8
        assert all(ld % 32 in (8, 24) for ld in cols)


@pytest.mark.parametrize("cols,smem", [(32, 156688), (64, 185360)])
def test_state16_launch(cols, smem):
    """Two stages of -W, K', Q e^G [64][136] bf16, P [64][72] bf16, U [64][cols + 4] fp32; S
    [128][cols + 8] and V' [64][cols + 8] bf16; G_L (16 bytes): one block per SM."""
    cfg = kchunk.state16_launch(cols)
    assert (cfg.kernel, cfg.cols, cfg.smem) == (f"gdn_chunk_state16_kernel<{cols}>", cols, smem)
    assert cfg.kernel in kchunk.SOURCE.name_expressions
    assert _fits(cfg.smem, 1)  # __launch_bounds__(256, 1)
    assert kchunk.LOCAL16.kernel in kchunk.SOURCE.name_expressions
    assert kchunk.LOCAL16.smem == kchunk.local_launch(BF16).smem and _fits(kchunk.LOCAL16.smem, 2)


@pytest.mark.parametrize("cols", (0, 16, 128))
def test_state16_launch_rejects_other_tiles(cols):
    with pytest.raises(ValueError):
        kchunk.state16_launch(cols)


def test_bf16_cols_choices():
    assert kchunk.BF16_COLS_CHOICES == envs.GDN_CHUNK_BF16_COLS == (0, 32, 64)
    assert kchunk.BF16_COLS in kchunk.BF16_COLS_CHOICES


@pytest.mark.parametrize("vpb,smem", [(2, 183808), (1, 126720)])
def test_localpair_launch(vpb, smem):
    """K, Q and vpb heads' V [64][136]; A / T [64][68], scratch [16][52] and six [64] vectors
    per head (fp32): one block (256 vpb threads) per SM."""
    cfg = kchunk.localpair_launch(vpb)
    assert (cfg.kernel, cfg.smem) == (f"gdn_chunk_localpair_kernel<{vpb}>", smem)
    assert cfg.kernel in kchunk.SOURCE.name_expressions
    assert _fits(cfg.smem, 1)  # __launch_bounds__(256 * VPB, 1)


@pytest.mark.parametrize("hk,hv,want", [(16, 32, 2), (2, 4, 2), (1, 2, 2), (2, 2, 1), (1, 3, 1),
                                        (4, 16, 2), (2, 6, 1)])
def test_localpair_heads(hk, hv, want):
    """Two value heads per block when they pair up inside each key head's group."""
    assert kchunk.localpair_heads(hk, hv) == want


def test_localpair_rejects_other_heads():
    with pytest.raises(ValueError):
        kchunk.localpair_launch(4)


def test_local_pair_default():
    assert kchunk.LOCAL_PAIR is envs.gdn_chunk_local_pair()
