"""The NINFER_* switches read by ninfer.envs."""
from __future__ import annotations

import pytest

from ninfer import envs

SWITCHES = [  # (reader, variable, default)
    (envs.cuda_debug_sync, "NINFER_CUDA_SYNC", False),
    (envs.gemv_rows, "NINFER_GEMV_ROWS", True),
    (envs.gemv_persist, "NINFER_GEMV_PERSIST", True),
    (envs.gemv_tma, "NINFER_GEMV_TMA", True),
    (envs.gemv_pdl, "NINFER_GEMV_PDL", True),
    (envs.pdl, "NINFER_PDL", True),
    (envs.prefill_overlap, "NINFER_PREFILL_OVERLAP", True),
    (envs.gdn_chunk_local_pair, "NINFER_GDN_CHUNK_LOCAL_PAIR", True),
    (envs.attention_mma, "NINFER_ATTN_MMA", False),
    (envs.attention_tma, "NINFER_ATTN_TMA", False),
    (envs.attention_acq_rel, "NINFER_ATTN_ACQ_REL", True),
    (envs.gemv_bf16_x, "NINFER_GEMV_BF16_X", True),
    (envs.moe_tma_down, "NINFER_MOE_TMA_DOWN", False),
    (envs.gdn_state_l2_last, "NINFER_GDN_STATE_L2_LAST", True),
    (envs.moe_tma_xpipe, "NINFER_MOE_TMA_XPIPE", True),
    (envs.moe_bf16_x, "NINFER_MOE_BF16_X", True),
    (envs.moe_bf16_act, "NINFER_MOE_BF16_ACT", True),
    (envs.norm_fold, "NINFER_NORM_FOLD", True),
    (envs.moe_norm_fold, "NINFER_MOE_NORM_FOLD", False),
    (envs.norm_fold_prefetch, "NINFER_NORM_FOLD_PREFETCH", True),
    (envs.gemv_x_vec, "NINFER_GEMV_X_VEC", True),
    (envs.gemv_x_vec_stages, "NINFER_GEMV_X_VEC_STAGES", True),
    (envs.moe_router_norm, "NINFER_MOE_ROUTER_NORM", True),
]


@pytest.mark.parametrize("reader, name, default", SWITCHES)
def test_switch(monkeypatch, reader, name, default):
    """Unset or empty: the default; "0": off; "1": on."""
    monkeypatch.delenv(name, raising=False)
    assert reader() is default
    for raw, want in (("1", True), ("0", False), ("", default)):
        monkeypatch.setenv(name, raw)
        assert reader() is want, raw


@pytest.mark.parametrize("reader, name, default, allowed", [
    (envs.gemv_tma_sk, "NINFER_GEMV_TMA_SK", 1024, envs.TMA_STAGE_K),
    (envs.moe_tma_sk, "NINFER_MOE_TMA_SK", 1024, envs.MOE_TMA_STAGE_K),
    (envs.gemv_tma_consumers, "NINFER_GEMV_TMA_CONSUMERS", 16, envs.TMA_CONSUMERS),
    (envs.gemv_tma_x_stages, "NINFER_GEMV_TMA_X_STAGES", 4, envs.TMA_X_STAGES),
    (envs.gemv_tma_tile_group, "NINFER_GEMV_TMA_TILE_GROUP", 4, envs.TMA_TILE_GROUPS),
    (envs.gdn_chunk_bf16_cols, "NINFER_GDN_CHUNK_BF16_COLS", 32, envs.GDN_CHUNK_BF16_COLS),
    (envs.gemv_tma_ring_kib, "NINFER_GEMV_TMA_RING_KIB", 192, envs.TMA_RING_KIB),
    (envs.attention_tma_stages, "NINFER_ATTN_TMA_STAGES", 4, envs.ATTN_TMA_STAGES),
    (envs.attention_tma_blocks, "NINFER_ATTN_TMA_BLOCKS", 0, envs.ATTN_TMA_BLOCKS),
    (envs.attention_chunk_grain_long, "NINFER_ATTN_CHUNK_GRAIN_LONG", 0,
     envs.ATTN_CHUNK_GRAINS_LONG),
    (envs.norm_max_nv, "NINFER_NORM_MAX_NV", 8, envs.NORM_MAX_NV),
    (envs.attention_merge_kernel, "NINFER_ATTN_MERGE_KERNEL", 2, envs.ATTN_MERGE_KERNEL),
])
def test_choice(monkeypatch, reader, name, default, allowed):
    """Unset or empty: the default; one of `allowed`: that value; anything else: ValueError."""
    monkeypatch.delenv(name, raising=False)
    assert reader() == default
    for value in allowed:
        monkeypatch.setenv(name, str(value))
        assert reader() == value
    for bad in ("300", "x", "-8", "1.5", "3", "7"):
        if bad in {str(v) for v in allowed}:
            continue
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            reader()
