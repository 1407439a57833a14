"""Preallocated activation buffers and per-step index arrays of the Qwen3.5 forward.

Everything the forward writes lives here, allocated once at start-up for `max_rows` rows (a
prefill chunk plus a full decode batch); a step uses leading slices, so the per-step loop
allocates nothing. Buffers that are never live at the same time share storage (`proj` serves
every layer's input projection, `ffn_act` both MLP kinds).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ninfer.models.qwen3_5.config import Qwen35Config


@dataclasses.dataclass(frozen=True)
class ProjectionSizes:
    """Widths of the fused projections, derived from the config."""

    gdn_in: int  # C + Vd + 2*Hv
    attn_qkv: int  # 2*A*D + 2*Hkv*D
    ffn_gate_up: int  # 2*I (dense) or 2*Is (shared expert)
    ffn_inner: int  # I or max(Im, Is)

    @classmethod
    def of(cls, cfg: Qwen35Config) -> "ProjectionSizes":
        hv = cfg.linear_num_value_heads
        gdn_in = cfg.conv_channels + cfg.linear_value_dim + 2 * hv
        attn = 2 * cfg.num_attention_heads * cfg.head_dim + 2 * cfg.num_key_value_heads * cfg.head_dim
        if cfg.is_moe:
            inner = max(cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size)
            gate_up = 2 * cfg.shared_expert_intermediate_size
        else:
            inner = cfg.intermediate_size
            gate_up = 2 * cfg.intermediate_size
        return cls(gdn_in=gdn_in, attn_qkv=attn, ffn_gate_up=gate_up, ffn_inner=inner)


def _bits_view(buffer, rows: int, width: int):
    """Contiguous uint16 [rows, width] (bf16 bits) over the start of an f32 buffer's storage."""
    return buffer.reshape(-1).view(np.uint16)[: rows * width].reshape(rows, width)


class Workspace:
    """Activation buffers for up to `max_rows` rows and `max_logit_rows` sampled rows.

    `xp` is numpy (CPU backend) or cupy (CUDA backend). All float buffers are float32.
    `bf16_operands`: also allocate `operand_bf16`, where the producer of a linear's x writes it
    as bf16 bits when the linear takes x so (CUDA: the prefill GEMMs, and the decode GEMVs
    under NINFER_GEMV_BF16_X). `norm_parts`: also allocate `norm_parts` f32 [max_rows,
    norm_parts], the row-block sums of r^2 of a folded norm (ops.linear_residual_norm).
    """

    def __init__(self, cfg: Qwen35Config, max_rows: int, max_logit_rows: int, xp=np,
                 bf16_operands: bool = False, norm_parts: int = 0):
        f32 = np.float32
        sizes = ProjectionSizes.of(cfg)
        n, h = max_rows, cfg.hidden_size
        a, d, hkv = cfg.num_attention_heads, cfg.head_dim, cfg.num_key_value_heads
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.max_rows = n
        self.max_logit_rows = max_logit_rows
        self.hidden = xp.empty((n, h), f32)  # residual stream
        self.normed = xp.empty((n, h), f32)  # input of the next mixer / FFN
        self.block_out = xp.empty((n, h), f32)  # output of the current mixer / FFN
        # flat buffers viewed as contiguous [rows, width] matrices of the width in use
        self._proj = xp.empty(n * max(sizes.gdn_in, sizes.attn_qkv, sizes.ffn_gate_up), f32)
        # Gated DeltaNet
        self.conv_out = xp.empty((n, cfg.conv_channels), f32)
        self.gdn_q = xp.empty((n, hk, dk), f32)
        self.gdn_k = xp.empty((n, hk, dk), f32)
        self.gdn_g = xp.empty((n, hv), f32)
        self.gdn_beta = xp.empty((n, hv), f32)
        self.gdn_core = xp.empty((n, hv, dv), f32)
        self.gdn_normed = xp.empty((n, hv, dv), f32)
        # gated attention
        self.attn_q = xp.empty((n, a, d), f32)
        self.attn_k = xp.empty((n, hkv, d), f32)
        self.attn_gate = xp.empty((n, a, d), f32)
        self.attn_out = xp.empty((n, a, d), f32)
        # FFN (dense SwiGLU, shared expert, MoE)
        self._ffn_act = xp.empty(n * sizes.ffn_inner, f32)
        if cfg.is_moe:
            k = cfg.num_experts_per_tok
            self.router_logits = xp.empty((n, cfg.num_experts + 1), f32)  # | shared-gate logit
            self.moe_weights = xp.empty((n, k), f32)
            self.moe_ids = xp.empty((n, k), np.int32)
            self.shared_out = xp.empty((n, h), f32)
        # final norm + lm_head for the sampled rows
        self.final_normed = xp.empty((max_logit_rows, h), f32)
        self.logits = xp.empty((max_logit_rows, cfg.vocab_size), f32)
        # a folded norm's sums of r^2: written by a block's output projection, read by the next
        # block's input projections (one norm live at a time)
        self.norm_parts = xp.empty((n, norm_parts), f32) if norm_parts else None
        # one operand is live at a time: each is read by the linear right after its producer
        self._operand_bf16 = None
        if bf16_operands:
            width = max(h, cfg.linear_value_dim, a * d, sizes.ffn_inner)
            self._operand_bf16 = xp.empty(max(n, max_logit_rows) * width, np.uint16)

    def proj(self, rows: int, width: int):
        """Contiguous [rows, width] output buffer of an input projection."""
        return self._proj[: rows * width].reshape(rows, width)

    def ffn_act(self, rows: int, width: int):
        """Contiguous [rows, width] buffer of the SwiGLU activation."""
        return self._ffn_act[: rows * width].reshape(rows, width)

    def normed_bf16(self, rows: int):
        """Contiguous uint16 [rows, H] buffer (bf16 bits) in the storage of `normed` (never live
        at the same time): an MoE layer's input where its readers take bf16 bits (it must
        outlive the router and the shared expert, so not `operand_bf16`)."""
        return _bits_view(self.normed, rows, self.normed.shape[1])

    def block_out_bf16(self, rows: int):
        """Contiguous uint16 [rows, H] buffer (bf16 bits) in the storage of `block_out`: a
        folded post-attention norm's x for an MoE layer's router (dead before the MoE block
        writes `block_out`)."""
        return _bits_view(self.block_out, rows, self.block_out.shape[1])

    def ffn_act_bf16(self, rows: int, width: int):
        """Contiguous uint16 [rows, width] buffer (bf16 bits) of the SwiGLU activation, in the
        storage of `ffn_act` (never live at the same time): the fused SwiGLU's output when its
        x is in `operand_bf16`."""
        return _bits_view(self._ffn_act, rows, width)

    @property
    def has_bf16_operands(self) -> bool:
        return self._operand_bf16 is not None

    def operand_bf16(self, rows: int, width: int):
        """Contiguous uint16 [rows, width] buffer (bf16 bits) of a linear's x: the normed hidden
        state, the GDN or attention output, or the SwiGLU activation."""
        return self._operand_bf16[: rows * width].reshape(rows, width)


class StepInputs:
    """Host index arrays of one step, filled in place (see docs/ops.md for their meaning).

    Rows are ordered: the prefill chunk's tokens first (one segment), then one row per decode
    sequence (one segment each). `row_seq` holds the StateImage slot of each row's sequence,
    which also indexes the persistent block-table matrix.
    """

    def __init__(self, max_rows: int, max_segments: int):
        self.ids = np.zeros(max_rows, np.int32)
        self.positions = np.zeros((3, max_rows), np.int32)
        self.row_slot = np.zeros(max_rows, np.int32)
        self.row_pos = np.zeros(max_rows, np.int32)
        self._positions_packed = np.zeros(3 * max_rows, np.int32)
        self._offsets = np.arange(max_rows, dtype=np.int32)
        self.seg_starts = np.zeros(max_segments + 1, np.int32)
        self.seg_slots = np.zeros(max_segments, np.int32)
        self.num_rows = 0
        self.num_segments = 0

    def packed_positions(self) -> np.ndarray:
        """The step's positions as a contiguous int32[3, num_rows] array."""
        n = self.num_rows
        out = self._positions_packed[: 3 * n].reshape(3, n)
        out[...] = self.positions[:, :n]
        return out

    def reset(self) -> None:
        self.num_rows = 0
        self.num_segments = 0

    def add_segment(self, slot: int, token_ids, start_pos: int) -> None:
        """Append `len(token_ids)` consecutive tokens of the sequence in `slot` from `start_pos`."""
        n0, count = self.num_rows, len(token_ids)
        n1 = n0 + count
        if count == 1:  # a decode row: scalar stores (slice stores cost ~1 us each)
            self.ids[n0] = token_ids[0]
            self.row_pos[n0] = start_pos
            self.positions[0, n0] = self.positions[1, n0] = self.positions[2, n0] = start_pos
            self.row_slot[n0] = slot
            self._end_segment(slot, n0, n1)
            return
        self.ids[n0:n1] = token_ids
        np.add(self._offsets[:count], start_pos, out=self.row_pos[n0:n1])
        self.positions[:, n0:n1] = self.row_pos[n0:n1]  # text: t = h = w = position
        self.row_slot[n0:n1] = slot
        self._end_segment(slot, n0, n1)

    def _end_segment(self, slot: int, n0: int, n1: int) -> None:
        g = self.num_segments
        self.seg_starts[g] = n0
        self.seg_starts[g + 1] = n1
        self.seg_slots[g] = slot
        self.num_rows = n1
        self.num_segments = g + 1
