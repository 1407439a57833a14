"""`rope`: partial NeoX rotary embedding with per-frequency MRoPE position axes (docs/ops.md)."""
from __future__ import annotations

from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of


def rope(x, positions, inv_freq, freq_axis) -> None:
    """Rotate the first R = 2 * len(inv_freq) dims of every head of x in place.

    x: f32[N, Hh, D] rows/heads strided, R <= D; positions: i32[3, N] (t, h, w rows);
    inv_freq: f32[R/2]; freq_axis: i32[R/2] with values in {0, 1, 2}. Frequency j uses angle
    float32(positions[freq_axis[j], n]) * inv_freq[j]; dim j pairs with dim j + R/2.
    """
    backend = backend_of(x, positions, inv_freq, freq_axis)
    n, _, d = check.array("rope", "x", x, check.F32, (None, None, None), check.Layout.ROWS)
    check.array("rope", "positions", positions, check.I32, (3, n))
    (half,) = check.array("rope", "inv_freq", inv_freq, check.F32, (None,))
    check.array("rope", "freq_axis", freq_axis, check.I32, (half,))
    if 2 * half > d:
        raise ValueError(f"rope: rotary dims {2 * half} exceed head dim {d}")
    check.kernels(backend, "rope").rope(x, positions, inv_freq, freq_axis)
