"""ninfer-bench without a GPU: shapes, the decode GEMV list, argument errors as one line."""
from __future__ import annotations

import pytest

from bench import cli
from bench.shapes import SHAPES, resolve


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


@pytest.mark.parametrize("command", ["decode", "prefill", "serve-sim"])
def test_whole_model_hooks_are_not_implemented_yet(capsys, command):
    assert cli.main([command, "--shape", "9b"]) == 2
    assert "not implemented yet" in capsys.readouterr().err


def test_unknown_op_is_rejected():
    with pytest.raises(SystemExit):
        cli.main(["kernels", "--op", "no_such_op"])
