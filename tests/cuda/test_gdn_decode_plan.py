"""gdn_decode_fused launch planning on the CPU (no GPU)."""
from __future__ import annotations

import pytest


def test_gdn_decode_kernel_choice(monkeypatch):
    """gdn_decode_fused (CPU): on sm_90 the cluster4 kernel while its 4 * Hv * N blocks fit one
    wave of 2 per SM, then the staged kernel with the most blocks per head that fits one wave
    (staged2; staged4 has cluster4's occupancy, so it is never picked), else staged1; "head"
    when the state cannot be staged and always below sm_90 (all bitwise equal, so the choice by
    N keeps batch invariance); VARIANT forces one. The rule is provisional (occupancy
    arithmetic, not timings)."""
    from ninfer.kernels_cuda import gdn_decode as kdec

    monkeypatch.setattr(kdec, "VARIANT", None)
    monkeypatch.setattr(kdec, "_cluster_device", lambda: (True, 132))
    assert [kdec.choose_variant(32, n) for n in range(1, 9)] == \
        ["cluster4"] * 2 + ["staged2"] * 2 + ["staged1"] * 4
    assert [kdec.choose_variant(48, n) for n in (1, 2, 3, 8)] == \
        ["cluster4", "staged2", "staged1", "staged1"]
    assert [kdec.choose_variant(16, n) for n in (4, 5, 8, 9, 16)] == \
        ["cluster4", "staged2", "staged2", "staged1", "staged1"]
    assert [kdec.choose_variant(32, n, stageable=False) for n in (2, 3, 8)] == \
        ["cluster4", "head", "head"]
    monkeypatch.setattr(kdec, "_cluster_device", lambda: (False, 132))
    assert kdec.choose_variant(32, 1) == "head" and kdec.choose_variant(32, 8) == "head"
    monkeypatch.setattr(kdec, "VARIANT", "staged2")
    assert kdec.choose_variant(32, 8) == "staged2"


def test_gdn_decode_variants_cover_instances():
    """Every variant has its kernel instances in SOURCE (kc <= 4 and kc <= 8), blocks per head
    dividing the 4 column groups; a bad NINFER_GDN_DECODE_KERNEL is refused at import."""
    import importlib
    import os

    from ninfer.kernels_cuda import gdn_decode as kdec

    for v in kdec.VARIANTS.values():
        assert kdec.GROUPS % v.blocks_per_head == 0
        for m in (3, 7):
            assert f"{v.kernel}<{m}>" in kdec.SOURCE.name_expressions
    old = os.environ.get("NINFER_GDN_DECODE_KERNEL")
    try:
        os.environ["NINFER_GDN_DECODE_KERNEL"] = "nope"
        with pytest.raises(ValueError, match="NINFER_GDN_DECODE_KERNEL"):
            importlib.reload(kdec)
        os.environ["NINFER_GDN_DECODE_KERNEL"] = "staged1"
        assert importlib.reload(kdec).VARIANT == "staged1"
    finally:
        if old is None:
            os.environ.pop("NINFER_GDN_DECODE_KERNEL", None)
        else:
            os.environ["NINFER_GDN_DECODE_KERNEL"] = old
        importlib.reload(kdec)
