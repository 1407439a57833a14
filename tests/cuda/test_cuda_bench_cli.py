"""ninfer-bench without a GPU: shapes, the decode GEMV list, argument errors as one line."""
from __future__ import annotations

import pytest

from bench import cli
from bench.shapes import SHAPES, resolve
from tests.conftest import gpu_available


def test_shapes_match_the_spec_table():
    s = resolve("27b")
    assert (s.hidden, s.layers, s.gdn_layers, s.heads, s.kv_heads, s.value_heads) == \
        (5120, 64, 48, 24, 4, 48)
    assert s.conv_channels == 10240  # spec 3.2: in_proj_qkv [10240, 5120]
    moe = resolve("qwen3.5-35b-a3b")
    assert (moe.experts, moe.top_k, moe.moe_inter, moe.conv_channels) == (256, 8, 512, 8192)
    gemvs = dict((name, (m, k)) for name, m, k in resolve("9b").decode_gemvs())
    assert gemvs["attn qkv"] == (2 * 16 * 256 + 2 * 4 * 256, 4096)
    assert gemvs["lm_head"] == (248_320, 4096)
    assert set(SHAPES) == {"qwen3.5-0.8b", "qwen3.5-9b", "qwen3.5-27b", "qwen3.5-35b-a3b"}


def test_unknown_shape_is_one_line_error(capsys):
    assert cli.main(["kernels", "--shape", "7b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown shape" in err


@pytest.mark.parametrize("argv, message", [
    (["decode", "--shape", "9b", "--batch", "0"], "1..8"),
    (["decode", "--shape", "nope"], "unknown shape"),
    (["prefill", "--shape", "9b", "--tokens", "0"], ">= 1"),
    (["serve-sim", "--concurrency", "9"], "1..8"),
    (["serve-sim", "--output", "1"], "--output"),
    (["serve-sim", "--rounds", "0"], "--rounds"),
])
def test_whole_model_benchmarks_reject_bad_arguments(capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU error path")
@pytest.mark.parametrize("command", ["decode", "prefill", "serve-sim"])
def test_whole_model_benchmarks_without_a_gpu_fail_in_one_line(capsys, command):
    assert cli.main([command, "--shape", "0.8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ninfer-bench: error:")


def test_unknown_op_is_rejected():
    with pytest.raises(SystemExit):
        cli.main(["kernels", "--op", "no_such_op"])
