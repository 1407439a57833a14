"""gdn_decode_fused launch planning on the CPU (no GPU)."""
from __future__ import annotations


def test_gdn_decode_instances():
    """One kernel (head2), with instances for kc <= 4 and kc <= 8, each a __global__ template of
    gdn_decode.cu; the removed variants are gone from the source."""
    from ninfer.kernels_cuda import gdn_decode as kdec

    assert kdec.SOURCE.name_expressions == (f"{kdec.KERNEL}<3>", f"{kdec.KERNEL}<7>")
    text = kdec.SOURCE.path().read_text()
    assert f"\n    {kdec.KERNEL}(const DecodeParams p)" in text
    assert text.count("__global__") == 1
    for gone in ("gdn_decode_fused_kernel", "gdn_decode_fused_pair_kernel",
                 "gdn_decode_fused_head_kernel", "__cluster_dims__"):
        assert gone not in text, gone


def test_state_l2_last_build():
    """SOURCE_L2_LAST is SOURCE's instances with DEC_STATE_L2_LAST defined (the default build
    has no option), and gdn_decode.cu guards the policy with that macro."""
    from ninfer.kernels_cuda import gdn_decode as kdec

    assert kdec.SOURCE.options == ()
    assert kdec.SOURCE_L2_LAST.name_expressions == kdec.SOURCE.name_expressions
    assert kdec.SOURCE_L2_LAST.options == ("-DDEC_STATE_L2_LAST=1",)
    assert "#ifdef DEC_STATE_L2_LAST" in kdec.SOURCE.path().read_text()
