"""gdn_decode_fused launch planning on the CPU (no GPU)."""
from __future__ import annotations


def test_gdn_decode_kernel_choice(monkeypatch):
    """gdn_decode_fused (CPU): the cluster kernel while its 4 * Hv * N blocks fit one wave of 2
    per SM on sm_90, the one-block-per-head kernel beyond (bitwise equal, so the choice by N
    keeps batch invariance) and always below sm_90; USE_CLUSTER forces either."""
    from ninfer.kernels_cuda import gdn_decode as kdec

    monkeypatch.setattr(kdec, "USE_CLUSTER", None)
    monkeypatch.setattr(kdec, "_cluster_device", lambda: (True, 132))
    assert [kdec.use_cluster(32, n) for n in (1, 2, 3, 8)] == [True, True, False, False]
    assert [kdec.use_cluster(48, n) for n in (1, 2)] == [True, False]
    monkeypatch.setattr(kdec, "_cluster_device", lambda: (False, 132))
    assert not kdec.use_cluster(32, 1)
    monkeypatch.setattr(kdec, "USE_CLUSTER", True)
    assert kdec.use_cluster(32, 8)
