"""The Qwen3.5 text forward over one step's rows (math: shared/docs/qwen35-spec.md §4).

    h = embed[ids]
    for each layer:  h += Mixer(RMSNorm1p(h))        # Gated DeltaNet or gated attention
                     h += FFN(RMSNorm1p(h))          # SwiGLU or MoE
    logits = RMSNorm1p(h[sampled rows]) @ lm_head^T

A step's rows mix one prefill chunk and the decode rows (docs/ops.md: every op computes a row
from that row's inputs and its sequence's state alone), so a row's values do not depend on what
else runs in the step. Recurrent state and KV are read and written in place through the
StateImage views and the paged KV pool.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ninfer import envs, ops
from ninfer.core.dtypes import DType, bf16_bits_to_f32
from ninfer.ops.attn_fused import prefill_attention_supported
from ninfer.ops.linear import (RowNorm, linear_residual_norm, norm_fold_applies, reads_bf16_x,
                               residual_norm_parts, swiglu_reads_bf16_x)
from ninfer.ops.moe import moe_norm_fold_parts, moe_reads_bf16_x
from ninfer.models.qwen3_5.config import LayerType, Qwen35Config
from ninfer.models.qwen3_5.parameters import (
    AttentionParams, DenseMLPParams, GDNParams, LayerParams, MoEParams, Parameters,
)
from ninfer.models.qwen3_5.workspace import Workspace

L2NORM_EPS = 1e-6


def rope_tables(cfg: Qwen35Config) -> tuple[np.ndarray, np.ndarray]:
    """(inv_freq f32[R/2], freq_axis i32[R/2]) for partial, interleaved MRoPE.

    Frequency j takes its position from row t (0), h (1) or w (2) of the 3-D position ids:
    h if j % 3 == 1 and j < 3*s_h, w if j % 3 == 2 and j < 3*s_w, else t.
    """
    half = cfg.rotary_dim // 2
    exponents = np.arange(0, cfg.rotary_dim, 2, dtype=np.float32) / np.float32(cfg.rotary_dim)
    inv_freq = (1.0 / (np.float32(cfg.rope.theta) ** exponents)).astype(np.float32)
    axis = np.zeros(half, np.int32)
    section = tuple(cfg.rope.mrope_section) + (0, 0, 0)
    if cfg.rope.mrope_interleaved:
        for j in range(half):
            if j % 3 == 1 and j < 3 * section[1]:
                axis[j] = 1
            elif j % 3 == 2 and j < 3 * section[2]:
                axis[j] = 2
    else:  # contiguous sections [t | h | w]
        t_end, h_end = section[0], section[0] + section[1]
        axis[t_end:h_end] = 1
        axis[h_end:] = 2
    return inv_freq, axis


def _mixer_input(layer: LayerParams):
    """The weight of the one linear reading a layer's mixer input (its input projection)."""
    if layer.kind is LayerType.LINEAR_ATTENTION:
        return layer.mixer.in_proj
    return layer.mixer.qkv_proj


def _mixer_output(layer: LayerParams):
    """The weight of a layer's mixer output projection (the linear its output comes from)."""
    if layer.kind is LayerType.LINEAR_ATTENTION:
        return layer.mixer.out_proj
    return layer.mixer.o_proj


def _ffn_output(ffn: DenseMLPParams | MoEParams):
    """What an FFN's output comes from, as `Qwen35Forward._norm_fold` takes it: a dense FFN's
    down projection (a Weight), or the MoE block (its MoEParams)."""
    return ffn.down if isinstance(ffn, DenseMLPParams) else ffn


def _f32(weight, xp):
    """A norm weight's values as f32 (bf16 bits widened exactly)."""
    if weight.dtype is DType.BFLOAT16:
        return bf16_bits_to_f32(weight.data, xp)
    return weight.data.astype(xp.float32)


@dataclasses.dataclass
class KernelWorkspaces:
    """Backend scratch the ops need beyond the activation buffers (CUDA; all None on the CPU).

    `fused_gdn_decode`: a step whose rows are all single-token segments runs each GDN layer as
    one `gdn_decode_fused` op; `chunked_gdn_prefill`: multi-token segments use the chunkwise
    (WY) delta rule instead of the token-by-token recurrence; `fused_attention_prep`: q/k norms,
    rope, the KV write and the gate copy of an attention layer run as one `attn_prep` op;
    `bf16_operands`: where a linear takes its x as bf16 bits (`ops.linear.reads_bf16_x`), the
    op producing x writes them into the Workspace's `operand_bf16` (which must exist) instead
    of f32. On the CUDA cuBLAS path, which rounds x to bf16 anyway, that gives bitwise the same
    results without the conversion launch; on the bf16-x GEMV (NINFER_GEMV_BF16_X: decode) it
    rounds the activations to bf16, as the prefill GEMMs do, and halves the x bytes every GEMV
    block reads. `gdn_chunk_precision`: the chunked prefill's `Precision`
    (kernels_cuda.gdn_chunk; None: the launcher's default).
    """

    attention: object = None
    moe: object = None
    gdn_chunk: object = None
    gdn_chunk_precision: object = None
    gdn_decode_counters: object = None
    linear_bf16: object = None
    sample_scratch: object = None
    fused_gdn_decode: bool = False
    chunked_gdn_prefill: bool = False
    fused_attention_prep: bool = False
    fused_swiglu: bool = False  # bf16 gate_up projections as one linear_swiglu op (decode)
    # paged_attention applies the output gate (no sigmoid_mul launch) where o_proj reads f32
    fused_attention_gate: bool = True
    # MoE layers route (moe_route with the `moe` workspace) before the shared expert, then
    # moe_block(routed=True): the routing's latency hides behind the shared expert's GEMVs
    moe_route_first: bool = True
    # with moe_route_first: the routing runs on an extra block of the shared expert's gate_up
    # GEMV (one moe_route_with_swiglu launch) where it applies (decode; fused_swiglu)
    moe_route_with_swiglu: bool = False
    # with moe_route_with_swiglu: the shared expert's down projection runs inside moe_block's
    # down launch where ops.moe_block_folds_shared_down (decode; bitwise the linear launch)
    moe_fold_shared_down: bool = False
    # where an MoE layer's input is bf16 bits, its experts' activations are rounded to bf16 too
    # (moe_block bf16_act; NINFER_MOE_BF16_ACT, read when the workspaces are built)
    moe_bf16_act: bool = dataclasses.field(default_factory=envs.moe_bf16_act)
    # a dense layer's norms ride on the GEMVs around them where ops.linear.norm_fold_applies
    # (NormFold; NINFER_NORM_FOLD, read when the CUDA backend builds its decode workspaces);
    # needs a Workspace with norm_parts
    norm_fold: bool = False
    # with norm_fold: an MoE block's output carries the next layer's input norm too
    # (ops.moe_block norm_fold; NINFER_MOE_NORM_FOLD)
    moe_norm_fold: bool = False
    # with norm_fold: an MoE layer's post-attention norm rides on the mixer's output projection
    # and its router GEMV, which also writes x / rms for the MoE block (NINFER_MOE_ROUTER_NORM)
    moe_router_norm: bool = False
    flash_prefill: bool = False  # prompt chunks' attention on tensor cores (bf16 KV)
    batch_invariant: bool = False  # GEMMs whose row results do not depend on the row count
    bf16_operands: bool = False

    def kw(self, value) -> dict:
        return {} if value is None else {"workspace": value}


@dataclasses.dataclass(frozen=True)
class NormFold:
    """An RMSNorm carried by the GEMVs around it (ops.linear_residual_norm, RowNorm): the block
    before it ends with `linear_residual_norm(y, w_out, hidden, gain, x, row_norm.parts)`
    instead of a linear and `add_rms_norm`; the block after it reads `x` (bf16 bits [N, H],
    r * gain) and passes `row_norm` to its input projections."""

    gain: object  # f32 [H]: the norm's 1 + w
    x: object
    row_norm: RowNorm


class StepContext:
    """Views of one step's index arrays on the executing backend (leading `n` rows).

    `prefill_segment`: (block-table row, first position) on the host when the rows are one
    sequence's consecutive positions (a prompt chunk), else None. `prefill_segment_dev`: an
    optional int32[3] device copy of it plus the live row count, which kernels read when they
    run (so that a captured prefill graph serves any sequence, position and chunk length up to
    its rows; the rows past the live count are padding).
    """

    def __init__(self, ids, positions, row_slot, row_pos, seg_starts, seg_slots, block_tables,
                 logit_rows: slice, prefill_segment: tuple[int, int] | None = None,
                 prefill_segment_dev=None):
        self.ids = ids
        self.positions = positions
        self.row_slot = row_slot
        self.row_pos = row_pos
        self.seg_starts = seg_starts
        self.seg_slots = seg_slots
        self.block_tables = block_tables
        self.logit_rows = logit_rows
        self.prefill_segment = prefill_segment
        self.prefill_segment_dev = prefill_segment_dev
        self.n = int(ids.shape[0])
        self.decode_only = self.n == int(seg_slots.shape[0])  # every segment is one token


class Qwen35Forward:
    """Runs the model over a StepContext; owns no state beyond references to its stores."""

    def __init__(self, cfg: Qwen35Config, params: Parameters, ws: Workspace, kv_pool, states,
                 xp=np, kernel_ws: KernelWorkspaces | None = None):
        self.kws = kernel_ws or KernelWorkspaces()
        if self.kws.bf16_operands and not ws.has_bf16_operands:
            raise ValueError("bf16_operands needs a Workspace built with bf16_operands=True")
        self.xp = xp
        self.cfg = cfg
        self.params = params
        self.ws = ws
        self.kv = kv_pool
        self.states = states
        inv_freq, axis = rope_tables(cfg)
        self.inv_freq = xp.asarray(inv_freq)
        self.freq_axis = xp.asarray(axis)
        self._attn_index = {layer: i for i, layer in enumerate(cfg.full_attention_layers)}
        # prompt chunks take the tensor-core prefill attention when the KV pages allow it
        self.flash_prefill = bool(self.kws.flash_prefill and kv_pool.k and
                                  prefill_attention_supported(kv_pool.k[0].dtype, cfg.head_dim,
                                                              kv_pool.page_size))
        self._gdn_index = {layer: i for i, layer in enumerate(cfg.linear_attention_layers)}
        if self.kws.norm_fold and ws.norm_parts is None:
            raise ValueError("norm_fold needs a Workspace built with norm_parts")
        # the norms' 1 + w as f32, as the norm kernels compute it (for folded norms)
        self._gains = {} if not self.kws.norm_fold else {
            id(w): xp.float32(1.0) + _f32(w, xp) for layer in params.layers
            for w in (layer.input_norm, layer.post_norm)}

    # -- whole model ---------------------------------------------------------------------------
    def __call__(self, ctx: StepContext):
        """Returns logits f32[rows in ctx.logit_rows, V] (a workspace view), or None for no rows."""
        cfg, p, ws, n = self.cfg, self.params, self.ws, ctx.n
        h, out = ws.hidden[:n], ws.block_out[:n]
        ops.embedding(ctx.ids, p.embed, h)
        x = self._normed(n, _mixer_input(p.layers[0]))
        ops.rms_norm(h, p.layers[0].input_norm, cfg.rms_norm_eps, x, zero_centered=True)
        row_norm = None  # x's deferred norm where the norm before the block was folded
        for i, layer in enumerate(p.layers):
            fold = self._norm_fold(n, layer.post_norm, _mixer_output(layer), layer.ffn)
            self._mixer(i, layer, x, out, ctx, row_norm, fold)
            if fold is None:
                x, row_norm = self._ffn_normed(n, layer.ffn), None
                ops.add_rms_norm(h, out, layer.post_norm, cfg.rms_norm_eps, x)
            else:
                x, row_norm = fold.x, fold.row_norm
            nxt = p.layers[i + 1] if i + 1 < len(p.layers) else None
            fold = None if nxt is None else self._norm_fold(
                n, nxt.input_norm, _ffn_output(layer.ffn), nxt)
            self._ffn(layer.ffn, x, out, row_norm, fold)
            if fold is not None:
                x, row_norm = fold.x, fold.row_norm
            elif nxt is not None:
                x, row_norm = self._normed(n, _mixer_input(nxt)), None
                ops.add_rms_norm(h, out, nxt.input_norm, cfg.rms_norm_eps, x)
        rows = ctx.logit_rows
        b = rows.stop - rows.start
        if b == 0:
            return None
        normed = self._x_buffer(b, cfg.hidden_size, p.lm_head, ws.final_normed[:b])
        logits = ws.logits[:b]
        # the last residual add of the logit rows, in the final norm's launch
        ops.add_rms_norm(h[rows], out[rows], p.final_norm, cfg.rms_norm_eps, normed)
        self._linear(normed, p.lm_head, logits)
        return logits

    def _linear(self, x, weight, out, row_norm: RowNorm | None = None, normed_out=None) -> None:
        extra = {} if row_norm is None else {"row_norm": row_norm}
        if normed_out is not None:
            extra["normed_out"] = normed_out
        ops.linear(x, weight, out, batch_invariant=self.kws.batch_invariant,
                   **self.kws.kw(self.kws.linear_bf16), **extra)

    def _block_out(self, y, weight, out, fold: NormFold | None) -> None:
        """A block's output projection: into `out` (the caller adds it to the residual stream
        in the next norm's launch), or with the next norm folded in (`fold`)."""
        if fold is None:
            self._linear(y, weight, out)
            return
        n = y.shape[0]
        linear_residual_norm(y, weight, self.ws.hidden[:n], fold.gain, fold.x, fold.row_norm.parts)

    # -- folded norms ----------------------------------------------------------------------------
    def _norm_fold(self, rows: int, norm, producer, consumer) -> NormFold | None:
        """The NormFold of `norm` between the block ending in `producer` (the Weight of its
        output projection, or an MoE block's MoEParams) and `consumer` (the next LayerParams,
        whose mixer's input projection reads the norm; DenseMLPParams, whose fused gate_up
        reads it; MoEParams, whose router reads it and writes x / rms for the rest of the
        block), or None where it does not apply (kws.norm_fold, bf16-x GEMVs of decode rows;
        an MoE producer: kws.moe_norm_fold and ops.moe_block_folds_norm; an MoE consumer:
        kws.moe_router_norm and a bf16 MoE input, `moe_reads_bf16_x`)."""
        if not self.kws.norm_fold:
            return None
        hidden = self.cfg.hidden_size
        if isinstance(producer, MoEParams):
            if not (self.kws.moe_norm_fold and ops.moe_block_folds_norm(
                    rows, self.cfg.num_experts_per_tok, hidden, producer.experts_gate_up,
                    batch_invariant=self.kws.batch_invariant)):
                return None
            width, linears = moe_norm_fold_parts(hidden), ()
        else:
            width, linears = None, (producer,)
        x = self.ws.normed_bf16(rows)
        if isinstance(consumer, DenseMLPParams):
            readers = (consumer.gate_up, consumer.down)  # the fused SwiGLU writes a bf16 act
            if not self._fused_swiglu(consumer.gate_up):
                return None
        elif isinstance(consumer, LayerParams):
            readers = (_mixer_input(consumer),)
        elif isinstance(consumer, MoEParams):
            if not (self.kws.moe_router_norm and moe_reads_bf16_x(
                    rows, consumer.router_gate, consumer.shared_gate_up,
                    consumer.experts_gate_up, batch_invariant=self.kws.batch_invariant)):
                return None
            # r * (1 + w) goes to block_out's storage: the router writes x / rms into normed's
            # (the MoE input's buffer, which the rest of the block reads)
            readers, x = (consumer.router_gate,), self.ws.block_out_bf16(rows)
        else:
            return None
        if not all(norm_fold_applies(rows, w) for w in (*linears, *readers)):
            return None
        width = residual_norm_parts(producer) if width is None else width
        parts = self.ws.norm_parts[:rows, :width]
        return NormFold(self._gains[id(norm)], x, RowNorm(parts, hidden, self.cfg.rms_norm_eps))

    # -- where linear inputs are written -------------------------------------------------------
    def _x_buffer(self, rows: int, width: int, weight, f32_buffer, *, swiglu: bool = False,
                  bf16_buffer=None):
        """The buffer the producer of `linear(x, weight)`'s x (`linear_swiglu` where `swiglu`)
        writes: a bf16 operand buffer (`bf16_buffer`, default the Workspace's `operand_bf16`)
        when that linear takes x as bf16 bits, else `f32_buffer`. `weight` None: x has other
        readers, which need f32."""
        if weight is None or not self.kws.bf16_operands:
            return f32_buffer
        if swiglu:
            reads = swiglu_reads_bf16_x(weight)
        else:
            reads = reads_bf16_x(rows, weight, batch_invariant=self.kws.batch_invariant)
        if not reads:
            return f32_buffer
        return self.ws.operand_bf16(rows, width) if bf16_buffer is None else bf16_buffer

    def _normed(self, rows: int, weight, *, swiglu: bool = False):
        return self._x_buffer(rows, self.cfg.hidden_size, weight, self.ws.normed[:rows],
                              swiglu=swiglu)

    def _ffn_normed(self, rows: int, w: DenseMLPParams | MoEParams):
        """The buffer of the FFN input: for an MoE layer bf16 bits where the router, the shared
        expert and the experts all take them (`moe_reads_bf16_x`), else f32; for a dense one
        what its gate_up projection reads."""
        if isinstance(w, MoEParams):
            if self.kws.bf16_operands and moe_reads_bf16_x(
                    rows, w.router_gate, w.shared_gate_up, w.experts_gate_up,
                    batch_invariant=self.kws.batch_invariant):
                return self.ws.normed_bf16(rows)
            return self.ws.normed[:rows]
        return self._normed(rows, w.gate_up, swiglu=self._fused_swiglu(w.gate_up))

    def _fused_swiglu(self, gate_up) -> bool:
        return self.kws.fused_swiglu and gate_up.dtype is DType.BFLOAT16

    def _mixer(self, i: int, layer: LayerParams, x, out, ctx: StepContext,
               row_norm: RowNorm | None = None, fold: NormFold | None = None) -> None:
        """`row_norm`: x's deferred norm (its input projection divides by it); `fold`: the norm
        after the mixer, folded into its output projection (else the output goes to `out`)."""
        if layer.kind is LayerType.LINEAR_ATTENTION:
            self._gated_deltanet(self._gdn_index[i], layer.mixer, x, out, ctx, row_norm, fold)
        else:
            self._gated_attention(self._attn_index[i], layer.mixer, x, out, ctx, row_norm, fold)

    # -- Gated DeltaNet ----------------------------------------------------------------------
    def _gated_deltanet(self, g_idx: int, w: GDNParams, x, out, ctx: StepContext,
                        row_norm: RowNorm | None = None, fold: NormFold | None = None) -> None:
        cfg, ws, n = self.cfg, self.ws, ctx.n
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kd, vd, c = cfg.linear_key_dim, cfg.linear_value_dim, cfg.conv_channels

        proj = ws.proj(n, c + vd + 2 * hv)
        self._linear(x, w.in_proj, proj, row_norm)  # [qkv | z | b | a]
        qkv, z = proj[:, :c], proj[:, c: c + vd]
        b, a = proj[:, c + vd: c + vd + hv], proj[:, c + vd + hv:]

        if self.kws.fused_gdn_decode and ctx.decode_only:
            y = self._x_buffer(n, vd, w.out_proj, ws.gdn_normed[:n].reshape(n, vd))
            ops.gdn_decode_fused(qkv, w.conv, self.states.conv_view(g_idx), a, b, w.a_log,
                                 w.dt_bias, self.states.rec_view(g_idx), ctx.seg_slots,
                                 z.reshape(n, hv, dv), w.norm, cfg.rms_norm_eps,
                                 y.reshape(n, hv, dv), counters=self.kws.gdn_decode_counters)
            self._block_out(y, w.out_proj, out, fold)
            return
        u = ws.conv_out[:n]
        ops.gdn_conv(qkv, w.conv, self.states.conv_view(g_idx), ctx.seg_starts, ctx.seg_slots, u)
        q = u[:, :kd].reshape(n, hk, dk)
        k = u[:, kd: 2 * kd].reshape(n, hk, dk)
        v = u[:, 2 * kd:].reshape(n, hv, dv)
        q_hat, k_hat = ws.gdn_q[:n], ws.gdn_k[:n]
        ops.l2norm_heads(q, L2NORM_EPS, dk ** -0.5, q_hat)
        ops.l2norm_heads(k, L2NORM_EPS, 1.0, k_hat)
        g, beta = ws.gdn_g[:n], ws.gdn_beta[:n]
        ops.gdn_gates(a, b, w.a_log, w.dt_bias, g, beta)

        core = ws.gdn_core[:n]
        if self.kws.chunked_gdn_prefill and not ctx.decode_only:
            ops.gdn_chunk_prefill(q_hat, k_hat, v, g, beta, self.states.rec_view(g_idx),
                                  ctx.seg_starts, ctx.seg_slots, core,
                                  precision=self.kws.gdn_chunk_precision,
                                  **self.kws.kw(self.kws.gdn_chunk))
        else:
            ops.gdn_recurrence(q_hat, k_hat, v, g, beta, self.states.rec_view(g_idx),
                               ctx.seg_starts, ctx.seg_slots, core)
        y = self._x_buffer(n, vd, w.out_proj, ws.gdn_normed[:n].reshape(n, vd))
        ops.gated_rms_norm(core, z.reshape(n, hv, dv), w.norm, cfg.rms_norm_eps,
                           y.reshape(n, hv, dv))
        self._block_out(y, w.out_proj, out, fold)

    # -- gated full attention ----------------------------------------------------------------
    def _gated_attention(self, a_idx: int, w: AttentionParams, x, out, ctx: StepContext,
                         row_norm: RowNorm | None = None, fold: NormFold | None = None) -> None:
        cfg, ws, n = self.cfg, self.ws, ctx.n
        a, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

        proj = ws.proj(n, 2 * a * d + 2 * hkv * d)
        self._linear(x, w.qkv_proj, proj, row_norm)
        q_and_gate = proj[:, : 2 * a * d].reshape(n, a, 2 * d)  # per head [q_h | gate_h]
        k = proj[:, 2 * a * d: 2 * a * d + hkv * d].reshape(n, hkv, d)
        v = proj[:, 2 * a * d + hkv * d:].reshape(n, hkv, d)

        q_hat, k_hat, gate = ws.attn_q[:n], ws.attn_k[:n], ws.attn_gate[:n]
        k_pages, v_pages = self.kv.k[a_idx], self.kv.v[a_idx]
        attn = ws.attn_out[:n]
        flat = attn.reshape(n, a * d)
        gated = self._x_buffer(n, a * d, w.o_proj, flat)  # in place when f32
        # paged_attention applies the output gate itself (bitwise attention then sigmoid_mul;
        # one launch less) and writes o_proj's x (f32 or bf16 bits); it reads the gate half
        # of q_and_gate directly (heads interleaved [q_h | gate_h]), the bits attn_prep copies
        flash = self.flash_prefill and ctx.prefill_segment is not None
        fuse_gate = self.kws.fused_attention_gate and not flash
        if self.kws.fused_attention_prep:
            ops.attn_prep(q_and_gate, k, v, w.q_norm, w.k_norm, cfg.rms_norm_eps, ctx.positions,
                          self.inv_freq, self.freq_axis, q_hat, gate, k_pages, v_pages,
                          ctx.block_tables, ctx.row_slot, ctx.row_pos)
        else:
            ops.rms_norm(q_and_gate[:, :, :d], w.q_norm, cfg.rms_norm_eps, q_hat,
                         zero_centered=True)
            ops.rms_norm(k, w.k_norm, cfg.rms_norm_eps, k_hat, zero_centered=True)
            ops.rope(q_hat, ctx.positions, self.inv_freq, self.freq_axis)
            ops.rope(k_hat, ctx.positions, self.inv_freq, self.freq_axis)
            ops.kv_write(k_hat, v, k_pages, v_pages, ctx.block_tables, ctx.row_slot, ctx.row_pos)
            if not fuse_gate:
                self.xp.copyto(gate, q_and_gate[:, :, d:])  # heads are interleaved [q_h | gate_h]
        if flash:
            seq, pos0 = ctx.prefill_segment
            ops.paged_prefill_attention(q_hat, k_pages, v_pages, ctx.block_tables, seq, pos0,
                                        d ** -0.5, attn, segment=ctx.prefill_segment_dev)
        else:
            ops.paged_attention(q_hat, k_pages, v_pages, ctx.block_tables, ctx.row_slot,
                                ctx.row_pos, d ** -0.5, gated.reshape(n, a, d) if fuse_gate
                                else attn,
                                gate=q_and_gate[:, :, d:] if fuse_gate else None,
                                past_kv_ready=ctx.decode_only,
                                **self.kws.kw(self.kws.attention))
        if not fuse_gate:
            ops.sigmoid_mul(flat, gate.reshape(n, a * d), gated)
        self._block_out(gated, w.o_proj, out, fold)

    # -- FFN -----------------------------------------------------------------------------------
    def _ffn(self, w: DenseMLPParams | MoEParams, x, out, row_norm: RowNorm | None = None,
             fold: NormFold | None = None) -> None:
        """`row_norm` / `fold` as `_mixer` takes them (an MoE block's router reads x with
        `row_norm` and writes x / rms for the rest of the block)."""
        if isinstance(w, DenseMLPParams):
            self._swiglu_mlp(w.gate_up, w.down, x, out, row_norm=row_norm, fold=fold)
        else:
            self._moe(w, x, out, fold, row_norm)

    def _swiglu_mlp(self, gate_up, down, x, out, *, f32_act: bool = False,
                    row_norm: RowNorm | None = None, fold: NormFold | None = None) -> None:
        """`f32_act`: the fused SwiGLU's activation stays f32 with a bf16 x (the MoE shared
        expert: as `moe_route_with_swiglu` writes it, so both paths give the same bits).
        `row_norm` / `fold`: as `_ffn` takes them (the fused SwiGLU with a bf16 act)."""
        n = x.shape[0]
        inner = gate_up.shape[0] // 2
        if self._fused_swiglu(gate_up):
            act = self.ws.ffn_act(n, inner)
            if x.dtype == np.uint16 and not f32_act:  # the activation too where down reads it
                act = self._x_buffer(n, inner, down, act,
                                     bf16_buffer=self.ws.ffn_act_bf16(n, inner))
            ops.linear_swiglu(x, gate_up, act,
                              **({} if row_norm is None else {"row_norm": row_norm}))
            self._block_out(act, down, out, fold)
            return
        assert row_norm is None and fold is None, "norm folds need the fused SwiGLU"
        gu = self.ws.proj(n, 2 * inner)
        self._linear(x, gate_up, gu)
        act = self._x_buffer(n, inner, down, self.ws.ffn_act(n, inner))
        ops.swiglu(gu, act)
        self._linear(act, down, out)

    def _route_with_swiglu(self, w: MoEParams, logits, x) -> bool:
        """Whether the routing and the shared expert's gate_up run as one launch: bitwise the
        moe_route and linear_swiglu launches of the other branch of `_moe`."""
        return (self.kws.moe_route_with_swiglu and self._fused_swiglu(w.shared_gate_up)
                and ops.moe_route_with_swiglu_applies(logits, self.cfg.num_experts_per_tok, x,
                                                      w.shared_gate_up, workspace=self.kws.moe))

    def _moe(self, w: MoEParams, x, out, norm: NormFold | None = None,
             row_norm: RowNorm | None = None) -> None:
        """`norm`: the next layer's input norm, folded into the block's last launch.
        `row_norm`: x's norm is deferred (x = bf16(r * (1 + w))); the router divides by it and
        writes x / rms into normed's storage, which the rest of the block reads."""
        ws, n, e, top_k = self.ws, x.shape[0], self.cfg.num_experts, self.cfg.num_experts_per_tok
        logits = ws.router_logits[:n]  # [router logits | shared-expert gate logit]
        weights, ids = ws.moe_weights[:n], ws.moe_ids[:n]
        if row_norm is None:
            self._linear(x, w.router_gate, logits)
        else:
            normed = ws.normed_bf16(n)
            self._linear(x, w.router_gate, logits, row_norm, normed_out=normed)
            x = normed
        routed = self.kws.moe_route_first
        shared = ws.shared_out[:n]
        fold = {}
        if routed and self._route_with_swiglu(w, logits[:, :e], x):
            act = ws.ffn_act(n, w.shared_gate_up.shape[0] // 2)
            ops.moe_route_with_swiglu(logits[:, :e], top_k, weights, ids, x, w.shared_gate_up,
                                      act, workspace=self.kws.moe)
            if self.kws.moe_fold_shared_down and ops.moe_block_folds_shared_down(
                    x, top_k, w.experts_gate_up, w.experts_down, w.shared_down, act,
                    batch_invariant=self.kws.batch_invariant):
                # moe_block runs the shared down projection inside its down launch
                shared, fold = act, {"shared_down": w.shared_down}
            else:
                self._linear(act, w.shared_down, shared)
        else:
            if routed:  # runs while the shared expert's weights start streaming (PDL)
                ops.moe_route(logits[:, :e], top_k, weights, ids, **self.kws.kw(self.kws.moe))
            self._swiglu_mlp(w.shared_gate_up, w.shared_down, x, shared, f32_act=True)
        bf16_act = x.dtype == np.uint16 and self.kws.moe_bf16_act
        ops.moe_block(x, logits[:, :e], top_k, w.experts_gate_up, w.experts_down, weights, ids,
                      out, shared=shared, shared_gate=logits[:, e:], **fold,
                      batch_invariant=self.kws.batch_invariant, routed=routed, bf16_act=bf16_act,
                      **self.kws.kw(self.kws.moe),
                      **({} if norm is None else {"norm_fold": (
                          self.ws.hidden[:n], norm.gain, norm.x, norm.row_norm.parts)}))
