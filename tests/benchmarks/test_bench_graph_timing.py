"""`BenchContext.time_graph` on the GPU: the graph holds `reps` calls and every replay runs them."""
from __future__ import annotations

import math

import numpy as np
import pytest

from bench.harness import BenchContext

pytestmark = pytest.mark.gpu


def test_time_graph_runs_reps_calls_per_replay():
    import cupy as cp

    from ninfer.core.cuda import DeviceContext

    dev = DeviceContext(0)
    with dev.activate():
        ctx = BenchContext(None, np.random.default_rng(0), dev.props.l2_bytes, warmup=2,
                           repeat=5)
        x = cp.zeros(1 << 20, dtype=cp.float32)
        ms, reps = ctx.time_graph(lambda i: cp.add(x, 1.0, out=x), reps=7)
        dev.synchronize()
        assert reps == 7 and ms > 0 and math.isfinite(ms)
        # eager warm-up (warmup + 3 calls), then (2 + repeat) replays of 7 calls
        assert float(x[0]) == 2 + 3 + (2 + 5) * 7
        ms_auto, reps_auto = ctx.time_graph(lambda i: cp.add(x, 1.0, out=x))
        assert 8 <= reps_auto <= 256 and ms_auto > 0


def test_time_graph_refuses_the_legacy_stream():
    import cupy as cp

    ctx = BenchContext(None, np.random.default_rng(0), 1 << 20)
    with cp.cuda.Stream.null:
        with pytest.raises(RuntimeError, match="non-default stream"):
            ctx.time_graph(lambda i: None, reps=1)
