"""gdn_chunk_prefill's launch configuration, on the CPU: the NINFER_GDN_CHUNK_* flags, the state
kernel instance each path picks, and that the shared memory sizes mirror gdn_chunk.cu's layouts
and fit the blocks per SM its __launch_bounds__ ask for (H100 / H200: 228 KiB per SM, 227 KiB
per block, 1 KiB reserved per block)."""
from __future__ import annotations

import pytest

from ninfer import envs
from ninfer.kernels_cuda import gdn_chunk as kchunk

SM_SMEM, BLOCK_SMEM_MAX, RESERVED = 228 * 1024, 227 * 1024, 1024


def test_state_cols_flag(monkeypatch):
    monkeypatch.delenv("NINFER_GDN_CHUNK_STATE_COLS", raising=False)
    assert envs.gdn_chunk_state_cols() == 32
    for raw, want in (("16", 16), ("32", 32), ("", 32)):
        monkeypatch.setenv("NINFER_GDN_CHUNK_STATE_COLS", raw)
        assert envs.gdn_chunk_state_cols() == want, raw
    for raw in ("8", "64", "x"):
        monkeypatch.setenv("NINFER_GDN_CHUNK_STATE_COLS", raw)
        with pytest.raises(ValueError):
            envs.gdn_chunk_state_cols()


def _fits(smem: int, blocks: int) -> bool:
    return smem <= BLOCK_SMEM_MAX and blocks * (smem + RESERVED) <= SM_SMEM


@pytest.mark.parametrize("split_o,state_cols,kernel,cols,smem", [
    (False, 32, "gdn_chunk_state_kernel<32, true>", 32, 161280),
    (False, 16, "gdn_chunk_state_kernel<32, true>", 32, 161280),  # the fused path has one tiling
    (True, 32, "gdn_chunk_state_kernel<32, false>", 32, 110080),
    (True, 16, "gdn_chunk_state_kernel<16, false>", 16, 93696),
])
def test_state_launch(split_o, state_cols, kernel, cols, smem):
    cfg = kchunk.state_launch(split_o, state_cols)
    assert (cfg.kernel, cfg.cols, cfg.smem) == (kernel, cols, smem)
    assert cfg.kernel in kchunk.SOURCE.name_expressions
    assert _fits(cfg.smem, 2 if split_o else 1)  # __launch_bounds__(256, FUSED_O ? 1 : 2)


def test_state_launch_rejects_other_tiles():
    with pytest.raises(ValueError):
        kchunk.state_launch(True, 64)


def test_output_and_local_smem():
    assert kchunk.OUTPUT_SMEM == (64 * 132 + 128 * 72 + 64 * 68 + 64 * 72 + 64) * 4
    assert _fits(kchunk.OUTPUT_SMEM, 2)  # gdn_chunk_output_kernel: __launch_bounds__(256, 2)
    assert _fits(kchunk.LOCAL_SMEM, 2)
    assert "gdn_chunk_output_kernel" in kchunk.SOURCE.name_expressions
