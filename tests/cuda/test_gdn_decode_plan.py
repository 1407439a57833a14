"""gdn_decode_fused launch planning on the CPU (no GPU)."""
from __future__ import annotations

import pytest


def test_gdn_decode_kernel_choice(monkeypatch):
    """gdn_decode_fused (CPU): "head2" for every N and head count (fastest at every B on the
    H200; all variants are bitwise equal, so any choice keeps batch invariance); VARIANT forces
    one."""
    from ninfer.kernels_cuda import gdn_decode as kdec

    monkeypatch.setattr(kdec, "VARIANT", None)
    assert {kdec.choose_variant(hv, n) for hv in (16, 32, 48) for n in range(1, 9)} == {"head2"}
    for name in ("cluster2", "head", "cluster4"):
        monkeypatch.setattr(kdec, "VARIANT", name)
        assert kdec.choose_variant(32, 8) == name


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
        os.environ["NINFER_GDN_DECODE_KERNEL"] = "head"
        assert importlib.reload(kdec).VARIANT == "head"
        os.environ["NINFER_GDN_DECODE_KERNEL"] = "head2"
        assert importlib.reload(kdec).VARIANT == "head2"
    finally:
        if old is None:
            os.environ.pop("NINFER_GDN_DECODE_KERNEL", None)
        else:
            os.environ["NINFER_GDN_DECODE_KERNEL"] = old
        importlib.reload(kdec)
