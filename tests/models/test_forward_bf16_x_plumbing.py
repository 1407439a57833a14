"""Where the decode forward writes bf16 operands (NINFER_GEMV_BF16_X), checked on the CPU by
recording the ops `Qwen35Forward` calls instead of running them: with every bf16 GEMV taking a
bf16 x, each linear / linear_swiglu of a dense decode step reads uint16 bits written by the op
just before it (the norms, the fused GDN decode, the gated paged attention, the fused SwiGLU),
the attention's output gate stays fused (no sigmoid_mul), and the SwiGLU output and its x live
in different buffers. Without the flag nothing is uint16. An MoE layer's input is bf16 bits where
`moe_reads_bf16_x` says its readers (the router, the shared expert, the experts) take them
(NINFER_MOE_BF16_X), else f32."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ninfer.core.dtypes import DType
from ninfer.core.kv_pool import PagedKVPool
from ninfer.core.state_image import StateImageStorage
from ninfer.models.qwen3_5 import forward as fwd_mod
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.cpu_backend import state_image_layout
from ninfer.models.qwen3_5.random_params import random_parameters
from ninfer.models.qwen3_5.workspace import Workspace
from ninfer.testing.checkpoints import TINY_DENSE, TINY_MOE


@dataclasses.dataclass
class Call:
    op: str
    args: tuple
    kwargs: dict


class OpRecorder:
    """Stands in for `ninfer.ops` inside forward.py: every op call is recorded, none runs."""

    def __init__(self, answers: dict | None = None):
        self.calls: list[Call] = []
        self.answers = answers or {}  # what the predicates (not recorded) return

    def __getattr__(self, name):
        if name in self.answers:
            return lambda *args, **kwargs: self.answers[name]

        def record(*args, **kwargs):
            self.calls.append(Call(name, args, kwargs))
        return record


def _reads_bf16(rows, weight, **_) -> bool:  # ops.linear.reads_bf16_x
    return weight.dtype is DType.BFLOAT16


def _swiglu_reads_bf16(gate_up) -> bool:  # ops.linear.swiglu_reads_bf16_x
    return gate_up.dtype is DType.BFLOAT16


FOLD_PARTS = 5  # the recorded residual_norm_parts


def _record_decode_step(monkeypatch, preset: dict, bf16_x: bool, rows: int = 3,
                        moe_bf16: bool = False, norm_fold: bool = False,
                        moe_norm_fold: bool = False, moe_router_norm: bool = False):
    arch = "Qwen3_5MoeForCausalLM" if "num_experts" in preset else "Qwen3_5ForCausalLM"
    cfg = Qwen35Config.from_hf(dict(preset), architecture=arch)
    params = random_parameters(cfg, dtype=DType.BFLOAT16)
    kv = PagedKVPool(len(cfg.full_attention_layers), 8, cfg.num_key_value_heads, 16,
                     cfg.head_dim, DType.FLOAT32)
    states = StateImageStorage(state_image_layout(cfg), rows + 1)
    ws = Workspace(cfg, rows, rows, bf16_operands=True, norm_parts=8 if norm_fold else 0)
    kws = fwd_mod.KernelWorkspaces(fused_gdn_decode=True, fused_attention_prep=True,
                                   fused_swiglu=True, bf16_operands=True, norm_fold=norm_fold,
                                   moe_norm_fold=moe_norm_fold, moe_router_norm=moe_router_norm)
    recorder = OpRecorder({"moe_block_folds_norm": True})
    monkeypatch.setattr(fwd_mod, "ops", recorder)
    # the norm fold's CUDA answers (bf16 weights on the bf16-x GEMV), its producer recorded
    monkeypatch.setattr(fwd_mod, "norm_fold_applies", lambda rows, w: _reads_bf16(rows, w))
    monkeypatch.setattr(fwd_mod, "residual_norm_parts", lambda w: FOLD_PARTS)
    monkeypatch.setattr(fwd_mod, "linear_residual_norm",
                        getattr(recorder, "linear_residual_norm"))
    # the CUDA answers under NINFER_GEMV_BF16_X (with it off: only cuBLAS rows, none here)
    monkeypatch.setattr(fwd_mod, "reads_bf16_x",
                        _reads_bf16 if bf16_x else lambda *a, **k: False)
    monkeypatch.setattr(fwd_mod, "swiglu_reads_bf16_x",
                        _swiglu_reads_bf16 if bf16_x else lambda *a, **k: False)
    monkeypatch.setattr(fwd_mod, "moe_reads_bf16_x", lambda *a, **k: moe_bf16)
    forward = fwd_mod.Qwen35Forward(cfg, params, ws, kv, states, kernel_ws=kws)
    idx = np.arange(rows, dtype=np.int32)
    ctx = fwd_mod.StepContext(ids=idx, positions=np.zeros((3, rows), np.int32), row_slot=idx,
                              row_pos=idx, seg_starts=np.arange(rows + 1, dtype=np.int32),
                              seg_slots=idx, block_tables=np.zeros((rows + 1, 4), np.int32),
                              logit_rows=slice(0, rows))
    assert ctx.decode_only
    forward(ctx)
    return cfg, recorder.calls


def _x_of(call: Call):
    return call.args[0]


# the ops that write a linear's x, and their `out` argument's position
_OUT_ARG = {"rms_norm": 3, "add_rms_norm": 4, "gdn_decode_fused": 12, "paged_attention": 7,
            "linear_swiglu": 2}


def _written(call: Call):
    return call.args[_OUT_ARG[call.op]]


def test_dense_decode_writes_every_gemv_x_as_bf16(monkeypatch):
    cfg, calls = _record_decode_step(monkeypatch, TINY_DENSE, bf16_x=True)
    names = [c.op for c in calls]
    assert "sigmoid_mul" not in names and "swiglu" not in names
    readers = [i for i, c in enumerate(calls) if c.op in ("linear", "linear_swiglu")]
    # per layer: the mixer's input projection and output projection, gate_up, down; + lm_head
    assert len(readers) == 4 * cfg.num_hidden_layers + 1
    for i in readers:
        call = calls[i]
        x = _x_of(call)
        assert x.dtype == np.uint16, f"{call.op} #{i} reads {x.dtype}"
        producer = calls[i - 1]
        if producer.op not in _OUT_ARG:
            raise AssertionError(f"{call.op} #{i}: x not written by the op before it")
        written = _written(producer).reshape(x.shape)
        assert written.dtype == np.uint16
        assert np.shares_memory(written, x) and written.shape == x.shape, (
            f"{call.op} #{i} does not read what {producer.op} wrote")
    attention = [c for c in calls if c.op == "paged_attention"]
    assert attention and all(c.kwargs["gate"] is not None for c in attention)
    for c in calls:
        if c.op == "linear_swiglu":
            x, out = c.args[0], c.args[2]
            assert out.dtype == np.uint16 and not np.shares_memory(x, out)
        if c.op == "linear":
            assert c.args[2].dtype == np.float32  # GEMV outputs stay f32 (residual, logits)


def test_without_the_flag_nothing_is_bf16(monkeypatch):
    _, calls = _record_decode_step(monkeypatch, TINY_DENSE, bf16_x=False)
    for c in calls:
        for a in (*c.args, *c.kwargs.values()):
            assert getattr(a, "dtype", None) != np.uint16, f"{c.op} got a uint16 operand"
    attention = [c for c in calls if c.op == "paged_attention"]
    assert attention and all(c.kwargs["gate"] is not None for c in attention)


def test_moe_input_stays_f32_where_its_readers_need_f32(monkeypatch):
    _, calls = _record_decode_step(monkeypatch, TINY_MOE, bf16_x=True, moe_bf16=False)
    for c in calls:
        if c.op in ("moe_block", "moe_route_with_swiglu"):
            x = c.args[0] if c.op == "moe_block" else c.args[4]
            assert x.dtype == np.float32, c.op
            assert not c.kwargs.get("bf16_act"), c.op
    # the mixers' projections still read bf16
    mixers = [c for c in calls if c.op == "linear" and c.args[0].dtype == np.uint16]
    assert mixers
    # an add_rms_norm into an MoE layer writes f32
    moe_norms = [calls[i] for i, c in enumerate(calls[1:], 1)
                 if c.op == "linear" and calls[i - 1].op == "add_rms_norm"
                 and c.args[0].dtype == np.float32]
    assert moe_norms


@pytest.mark.parametrize("preset", [TINY_DENSE, TINY_MOE])
def test_recorded_ops_name_real_ops(monkeypatch, preset):
    """The recorder only sees names `ninfer.ops` exports (a misspelt op would pass above)."""
    import ninfer.ops as real_ops
    _, calls = _record_decode_step(monkeypatch, preset, bf16_x=True)
    missing = {c.op for c in calls} - set(real_ops.__all__)
    assert not missing, missing


def test_moe_input_is_bf16_where_its_readers_take_it(monkeypatch):
    """moe_reads_bf16_x: the post-attention add_rms_norm writes the MoE input as bf16 bits in
    the storage of `normed` (not the shared operand buffer, which the shared expert's act may
    take), and the router, the shared expert's gate_up and moe_block all read those bits."""
    cfg, calls = _record_decode_step(monkeypatch, TINY_MOE, bf16_x=True, moe_bf16=True)
    blocks = [i for i, c in enumerate(calls) if c.op == "moe_block"]
    assert len(blocks) == cfg.num_hidden_layers
    for i in blocks:
        x = calls[i].args[0]
        assert x.dtype == np.uint16
        assert calls[i].kwargs["bf16_act"] is True  # NINFER_MOE_BF16_ACT (default on)
        norm = max(j for j in range(i) if calls[j].op == "add_rms_norm")
        written = _written(calls[norm])
        assert written.dtype == np.uint16 and np.shares_memory(written, x)
        readers = [c for c in calls[norm + 1:i] if c.op in ("linear", "linear_swiglu",
                                                             "moe_route_with_swiglu")]
        router = readers[0]
        assert router.op == "linear" and np.shares_memory(router.args[0], x)
        shared = [c for c in readers if c.op in ("linear_swiglu", "moe_route_with_swiglu")]
        assert len(shared) == 1
        sx = shared[0].args[0] if shared[0].op == "linear_swiglu" else shared[0].args[4]
        assert np.shares_memory(sx, x) and sx.dtype == np.uint16
        # the shared activation stays f32 on either path (moe_route_with_swiglu writes f32)
        act = shared[0].args[2] if shared[0].op == "linear_swiglu" else shared[0].args[6]
        assert act.dtype == np.float32
        # nothing between the norm and moe_block writes into x's storage
        for c in calls[norm + 1:i]:
            for a in (*c.args, *c.kwargs.values()):
                if c is not router and c is not shared[0] and hasattr(a, "dtype"):
                    assert not np.shares_memory(a, x), f"{c.op} touches the MoE input"


def test_moe_bf16_act_follows_its_flag(monkeypatch):
    monkeypatch.setenv("NINFER_MOE_BF16_ACT", "0")
    _, calls = _record_decode_step(monkeypatch, TINY_MOE, bf16_x=True, moe_bf16=True)
    blocks = [c for c in calls if c.op == "moe_block"]
    assert blocks and all(c.args[0].dtype == np.uint16 and c.kwargs["bf16_act"] is False
                          for c in blocks)


def test_norm_fold_carries_every_dense_norm_but_the_first_and_last(monkeypatch):
    """NormFold (NINFER_NORM_FOLD): a dense decode step has one rms_norm (layer 0's input) and
    one add_rms_norm (the final norm); every mixer / FFN output projection but the last FFN's
    is a linear_residual_norm into the residual stream (`hidden`), writing bf16 bits in
    `normed`'s storage with (1 + w) of the norm it carries and the parts columns in use; each
    of the next block's projections reads those bits with the RowNorm of the same parts; layer
    0's input projection and the lm_head take none."""
    cfg, calls = _record_decode_step(monkeypatch, TINY_DENSE, bf16_x=True, norm_fold=True)
    names = [c.op for c in calls]
    layers = cfg.num_hidden_layers
    assert names.count("rms_norm") == 1 and names.count("add_rms_norm") == 1
    folds = [i for i, c in enumerate(calls) if c.op == "linear_residual_norm"]
    assert len(folds) == 2 * layers - 1
    for i in folds:
        y, weight, hidden, gain, x, parts = calls[i].args
        assert hidden.dtype == np.float32 and hidden.shape == (3, cfg.hidden_size)
        assert x.dtype == np.uint16 and x.shape == (3, cfg.hidden_size)
        assert gain.dtype == np.float32 and gain.shape == (cfg.hidden_size,)
        assert parts.shape == (3, FOLD_PARTS) and parts.dtype == np.float32
        nxt = next(j for j in range(i + 1, len(calls)) if calls[j].op == "linear_residual_norm"
                   ) if i != folds[-1] else len(calls)
        readers = [c for c in calls[i + 1:nxt] if c.op in ("linear", "linear_swiglu")
                   and np.shares_memory(c.args[0], x)]
        assert readers and all(c.kwargs["row_norm"].parts is parts for c in readers)
        assert all(c.kwargs["row_norm"].dim == cfg.hidden_size for c in readers)
    # the gains are the norms' 1 + w, one per carried norm, all distinct arrays
    assert len({id(calls[i].args[3]) for i in folds}) == 2 * layers - 1
    first = next(c for c in calls if c.op == "linear")
    assert "row_norm" not in first.kwargs
    assert "row_norm" not in calls[-1].kwargs and calls[-1].op == "linear"  # lm_head


def test_norm_fold_leaves_moe_layers_alone(monkeypatch):
    """Without NINFER_MOE_NORM_FOLD an MoE model has no folded norm (its post-attention norm
    is read by the router, the shared expert and the experts, which take a normalised x)."""
    _, calls = _record_decode_step(monkeypatch, TINY_MOE, bf16_x=True, moe_bf16=True,
                                   norm_fold=True)
    assert not any(c.op == "linear_residual_norm" for c in calls)
    assert not any("row_norm" in c.kwargs or "norm_fold" in c.kwargs for c in calls)


def test_moe_norm_fold_carries_the_next_input_norm(monkeypatch):
    """NINFER_MOE_NORM_FOLD: every MoE block but the last gets `norm_fold` = (hidden, the next
    input norm's 1 + w, x in `normed`'s storage, parts [rows, ceil(H / 16)]); the next layer's
    input projection reads that x with the RowNorm of those parts; the post-attention norms
    (read by the MoE block) and the final norm stay launches."""
    cfg, calls = _record_decode_step(monkeypatch, TINY_MOE, bf16_x=True, moe_bf16=True,
                                     norm_fold=True, moe_norm_fold=True)
    names = [c.op for c in calls]
    layers = cfg.num_hidden_layers
    blocks = [i for i, c in enumerate(calls) if c.op == "moe_block"]
    assert len(blocks) == layers
    assert names.count("add_rms_norm") == layers + 1  # post-attention norms + the final one
    assert names.count("rms_norm") == 1 and "linear_residual_norm" not in names
    for i in blocks[:-1]:
        hidden, gain, x, parts = calls[i].kwargs["norm_fold"]
        assert hidden.shape == (3, cfg.hidden_size) and hidden.dtype == np.float32
        assert gain.shape == (cfg.hidden_size,) and gain.dtype == np.float32
        assert x.dtype == np.uint16 and x.shape == (3, cfg.hidden_size)
        assert parts.shape == (3, -(-cfg.hidden_size // 16))
        reader = next(c for c in calls[i + 1:] if c.op == "linear")
        assert np.shares_memory(reader.args[0], x)
        assert reader.kwargs["row_norm"].parts is parts
    assert "norm_fold" not in calls[blocks[-1]].kwargs


def test_moe_router_norm_carries_the_post_attention_norm(monkeypatch):
    """NINFER_MOE_ROUTER_NORM: each MoE layer's mixer ends in linear_residual_norm writing x
    into `block_out`'s storage (not the MoE input's); the router reads it with the RowNorm of
    those parts and writes x / rms (`normed_out`) into `normed`'s storage, which moe_block and
    the shared expert read; the post-attention add_rms_norm launches are gone."""
    cfg, calls = _record_decode_step(monkeypatch, TINY_MOE, bf16_x=True, moe_bf16=True,
                                     norm_fold=True, moe_router_norm=True)
    names = [c.op for c in calls]
    layers = cfg.num_hidden_layers
    assert names.count("add_rms_norm") == layers  # input norms of layers 1.. + the final one
    folds = [i for i, c in enumerate(calls) if c.op == "linear_residual_norm"]
    blocks = [i for i, c in enumerate(calls) if c.op == "moe_block"]
    assert len(folds) == layers and len(blocks) == layers
    for i, b in zip(folds, blocks):
        _, _, _, gain, x, parts = calls[i].args
        router = calls[i + 1]
        assert router.op == "linear" and np.shares_memory(router.args[0], x)
        assert router.kwargs["row_norm"].parts is parts
        normed = router.kwargs["normed_out"]
        assert normed.dtype == np.uint16 and not np.shares_memory(normed, x)
        assert np.shares_memory(calls[b].args[0], normed)
        for c in calls[i + 2:b]:  # the shared expert reads the normalised x, never x itself
            for a in (*c.args, *c.kwargs.values()):
                if hasattr(a, "dtype"):
                    assert not np.shares_memory(a, x), f"{c.op} reads the unnormalised x"
