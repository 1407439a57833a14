"""The CUDA backend of the Qwen3.5 Program: CuPy storage, RawModule kernels, CUDA graphs.

Same methods as `CpuBackend` (the Program does not know which one it drives). Differences:
- a step runs its decode rows by replaying the captured graph of exactly B rows
  (B = 1..max_batch) and its prefill chunk (cuBLAS GEMMs, chunkwise GDN) by replaying a prefill
  graph when the model allows one (dense, flash prefill attention): the chunk's rows are padded
  to the smallest captured size (the chunk size, halved down to PREFILL_MIN_BUCKET) that holds
  them, and the kernels read the live row count on the device (padding rows write no KV, belong
  to no GDN segment and feed no live row); inputs reach the graphs through fixed device buffers
  (ids, positions, slots, the chunk's segment, sampling parameters), never as graph keys;
- the block-table matrix lives on the device and is updated row by row when pages are added;
- sampling runs on the device inside the decode graph; only the tokens, their logprobs and the
  top alternatives come back (one D2H copy per step).
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np

from ninfer import envs, ops
from ninfer.core.dtypes import DType
from ninfer.core.kv_pool import PageAllocator, PagedKVPool
from ninfer.core.state_image import StateImageStorage
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.cpu_backend import state_image_layout
from ninfer.models.qwen3_5.forward import KernelWorkspaces, Qwen35Forward, StepContext
from ninfer.models.qwen3_5.parameters import GDNParams, Parameters
from ninfer.models.qwen3_5.stores import BackendStores
from ninfer.models.qwen3_5.sampler_inputs import MAX_TOP_LOGPROBS, SamplerInputs
from ninfer.models.qwen3_5.workspace import StepInputs, Workspace

_log = logging.getLogger("ninfer.cuda")
PREFILL_MIN_BUCKET = 16  # the smallest prefill graph (rows)
_SAMPLER_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "seeds", "counters")


def prefill_buckets(chunk: int) -> tuple[int, ...]:
    """Row counts of the prefill graphs, largest first: the chunk size, then halved while the
    half is >= PREFILL_MIN_BUCKET (1024: 1024, 512, 256, 128, 64, 32, 16). A chunk of n rows runs
    padded to the smallest one >= n, so padding is less than half of it (or < 16 rows)."""
    sizes = [chunk]
    while sizes[-1] // 2 >= PREFILL_MIN_BUCKET:
        sizes.append(sizes[-1] // 2)
    return tuple(sizes)


def _gdn_weights_bf16(params: Parameters) -> bool:
    """Every GDN layer's input projection is bf16: the model's activations reach the GDN core
    through bf16 GEMMs, so its chunked prefill runs its products in bf16 too
    (gdn_chunk.model_precision; NINFER_GDN_CHUNK_PRECISION overrides)."""
    mixers = [layer.mixer for layer in params.layers if isinstance(layer.mixer, GDNParams)]
    return bool(mixers) and all(m.in_proj.dtype is DType.BFLOAT16 for m in mixers)


@dataclasses.dataclass
class _DeviceRows:
    """Device copies of one forward's index arrays (fixed addresses: graph inputs)."""

    ids: object
    positions_flat: object  # int32[3 * max_rows]; positions(n) is a contiguous [3, n] view
    row_slot: object
    row_pos: object
    seg_starts: object
    seg_slots: object
    segment: object  # int32[3]: (block-table row, first position, live rows) of a prompt chunk

    @classmethod
    def allocate(cls, cp, max_rows: int) -> "_DeviceRows":
        i32 = np.int32
        return cls(cp.zeros(max_rows, i32), cp.zeros(3 * max_rows, i32), cp.zeros(max_rows, i32),
                   cp.zeros(max_rows, i32), cp.zeros(max_rows + 1, i32), cp.zeros(max_rows, i32),
                   cp.zeros(3, i32))

    def positions(self, n: int):
        return self.positions_flat[: 3 * n].reshape(3, n)

    def context(self, n: int, segments: int, block_tables, logit_rows: slice,
                prefill_segment: tuple[int, int] | None = None,
                segment_uploaded: bool = False) -> StepContext:
        """`segment_uploaded`: `self.segment` holds `prefill_segment` (kernels may read it)."""
        return StepContext(ids=self.ids[:n], positions=self.positions(n),
                           row_slot=self.row_slot[:n], row_pos=self.row_pos[:n],
                           seg_starts=self.seg_starts[: segments + 1],
                           seg_slots=self.seg_slots[:segments], block_tables=block_tables,
                           logit_rows=logit_rows, prefill_segment=prefill_segment,
                           prefill_segment_dev=self.segment if segment_uploaded else None)


class CudaBackend(BackendStores):
    def __init__(self, cfg: Qwen35Config, params: Parameters, device, *, num_pages: int,
                 page_size: int, num_slots: int, max_batch: int, prefill_chunk: int,
                 max_context_len: int, kv_dtype: DType = DType.BFLOAT16,
                 batch_invariant_prefill: bool = False):
        import cupy as cp

        from ninfer.kernels_cuda.attention import AttentionWorkspace
        from ninfer.kernels_cuda.gdn_chunk import ChunkWorkspace, model_precision
        from ninfer.kernels_cuda.gdn_decode import decode_counters

        self.cp = cp
        self.cfg = cfg
        self.params = params
        self.device = device
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        with device.activate():
            self.kv = PagedKVPool(len(cfg.full_attention_layers), num_pages,
                                  cfg.num_key_value_heads, page_size, cfg.head_dim, kv_dtype,
                                  xp=cp)
            # one slot more than planned, kept by the backend: the prefill graphs' warm-up and
            # capture run on it (its block-table row points at page 0, which it never writes)
            self.states = StateImageStorage(state_image_layout(cfg), num_slots + 1, xp=cp)
            self.scratch_slot = self.states.allocate()
            max_pages = -(-max_context_len // page_size)
            self.block_tables = cp.zeros((num_slots + 1, max_pages), np.int32)
            self.prefill_rows = _DeviceRows.allocate(cp, prefill_chunk)
            self.decode_rows = _DeviceRows.allocate(cp, max_batch)
            self.decode_rows.seg_starts[...] = cp.arange(max_batch + 1, dtype=np.int32)
            host_sampler = SamplerInputs(max_batch)
            self.sampler_dev = {f: cp.zeros(max_batch, getattr(host_sampler, f).dtype)
                                for f in _SAMPLER_FIELDS}
            self.pen_offsets = cp.zeros(max_batch + 1, np.int32)
            self.pen_capacity = max_batch * 4096
            self.pen_tokens = cp.zeros(self.pen_capacity, np.int32)
            self.pen_counts = cp.zeros(self.pen_capacity, np.int32)
            self.tokens_dev = cp.zeros(max_batch, np.int32)
            self.logprobs_dev = cp.zeros(max_batch, np.float32)
            self.top_ids_dev = cp.zeros((max_batch, MAX_TOP_LOGPROBS), np.int32)
            self.top_lp_dev = cp.zeros((max_batch, MAX_TOP_LOGPROBS), np.float32)
            self.top_count_dev = cp.zeros(1, np.int32)  # alternatives wanted by this step
            self._top_count_host = np.zeros(1, np.int32)  # the value top_count_dev holds
            widest_k = max(cfg.hidden_size, cfg.linear_value_dim,
                           cfg.num_attention_heads * cfg.head_dim, cfg.intermediate_size or 0,
                           cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size)
            moe_ws = None
            if cfg.is_moe:
                from ninfer.kernels_cuda.moe import MoeWorkspace

                moe_ws = MoeWorkspace.allocate(max(max_batch, prefill_chunk),
                                               cfg.num_experts_per_tok, cfg.hidden_size,
                                               cfg.moe_intermediate_size)
            route_first = envs.moe_route_first()
            # decode GEMVs read bf16 x
            from ninfer.kernels_cuda.linear import GEMV_BF16_X, NORM_FOLD_MAX_PARTS
            self.decode_kws = KernelWorkspaces(
                attention=AttentionWorkspace.allocate(max_batch, cfg.num_attention_heads,
                                                      cfg.head_dim, max_context_len),
                moe=moe_ws,
                gdn_decode_counters=decode_counters(max_batch, cfg.linear_num_key_heads),
                sample_scratch=cp.empty((max_batch, cfg.vocab_size), np.float32),
                fused_gdn_decode=True, fused_attention_prep=True, fused_swiglu=True,
                fused_attention_gate=envs.attn_gate_fused(), moe_route_first=route_first,
                moe_route_with_swiglu=envs.moe_route_swiglu(),
                moe_fold_shared_down=envs.moe_fold_shared(), bf16_operands=GEMV_BF16_X,
                norm_fold=GEMV_BF16_X and envs.norm_fold(), moe_norm_fold=envs.moe_norm_fold(),
                moe_router_norm=envs.moe_router_norm())
            self.prefill_kws = KernelWorkspaces(
                moe=moe_ws,
                gdn_chunk=ChunkWorkspace.allocate(prefill_chunk, 1, cfg.linear_num_value_heads),
                gdn_chunk_precision=model_precision(_gdn_weights_bf16(params)),
                linear_bf16=cp.empty(prefill_chunk * widest_k, np.uint16),
                chunked_gdn_prefill=True, fused_attention_prep=True,
                flash_prefill=True, batch_invariant=batch_invariant_prefill, bf16_operands=True,
                moe_route_first=route_first)
            self.prefill_ws = Workspace(cfg, prefill_chunk, 1, xp=cp, bf16_operands=True)
            self.decode_ws = Workspace(cfg, max_batch, max_batch, xp=cp,
                                       bf16_operands=GEMV_BF16_X,
                                       norm_parts=NORM_FOLD_MAX_PARTS
                                       if self.decode_kws.norm_fold else 0)
            self.prefill_forward = Qwen35Forward(cfg, params, self.prefill_ws, self.kv,
                                                 self.states, xp=cp, kernel_ws=self.prefill_kws)
            self.decode_forward = Qwen35Forward(cfg, params, self.decode_ws, self.kv,
                                                self.states, xp=cp, kernel_ws=self.decode_kws)
        self.pages = PageAllocator(num_pages)
        self.step_inputs = StepInputs(prefill_chunk + max_batch, max_segments=max_batch + 1)
        self.sampler_inputs = host_sampler
        self.graphs: dict[int, object] = {}
        self.use_graphs = True
        # prompt chunks replay captured graphs (eager prefill is host-bound: hundreds of
        # launches per chunk); needs every prefill kernel capturable: dense FFNs (the MoE prefill
        # syncs to group its rows) and the flash prefill attention (reads its segment on device).
        # Then every chunk runs padded to its bucket, replayed or (use_graphs off, or a failed
        # capture) eagerly, so both give the same results.
        self.prefill_graphs_ok = (not cfg.is_moe and self.prefill_forward.flash_prefill)
        self.prefill_buckets = prefill_buckets(prefill_chunk) if self.prefill_graphs_ok else ()
        self.prefill_graphs: dict[int, object] = {}
        self._pad_slots = np.full(prefill_chunk, -1, np.int32)  # host staging of padded rows
        self._pad_positions = np.zeros(3 * prefill_chunk, np.int32)
        self._segment_host = np.zeros(3, np.int32)
        self._seg_host = np.zeros(2, np.int32)
        # prompt chunks replayed beside the decode graph (execute)
        self.overlap_prefill = envs.prefill_overlap()
        with device.activate():
            self.prefill_stream = cp.cuda.Stream(non_blocking=True)
            self._step_ready = cp.cuda.Event(disable_timing=True)
            self._prefill_done = cp.cuda.Event(disable_timing=True)

    # -- slots and pages -------------------------------------------------------------------
    def zero_state(self, slot: int) -> None:
        with self.device.activate():
            self.states.zero(slot)

    def set_block_table(self, slot: int, pages: list[int]) -> None:
        with self.device.activate():
            self.block_tables[slot, : len(pages)].set(np.asarray(pages, np.int32),
                                                      stream=self.device.stream)

    # -- snapshots (host copies) -----------------------------------------------------------
    def copy_out_state(self, slot: int) -> np.ndarray:
        with self.device.activate():
            return self.cp.asnumpy(self.states.data[slot], stream=self.device.stream)

    def copy_in_state(self, slot: int, image: np.ndarray) -> None:
        with self.device.activate():
            self.states.data[slot].set(image, stream=self.device.stream)

    def copy_out_kv(self, pages: list[int], tokens: int) -> np.ndarray:
        cp = self.cp
        with self.device.activate():
            ids = cp.asarray(pages[: -(-tokens // self.kv.page_size)], np.int64)
            blocks = cp.stack([cp.stack([k[ids], v[ids]]) for k, v in zip(self.kv.k, self.kv.v)])
            return cp.asnumpy(blocks, stream=self.device.stream)

    def copy_in_kv(self, pages: list[int], blocks: np.ndarray) -> None:
        cp = self.cp
        with self.device.activate():
            ids = cp.asarray(pages[: blocks.shape[2]], np.int64)
            dev = cp.asarray(blocks)
            for layer, (k, v) in enumerate(zip(self.kv.k, self.kv.v)):
                k[ids] = dev[layer, 0]
                v[ids] = dev[layer, 1]

    # -- execution -------------------------------------------------------------------------
    def execute(self, num_decode: int) -> None:
        """The decode rows by graph replay, then the prefill chunk; results on the host.

        The two touch disjoint rows, pages, state slots and workspaces, so their order changes
        no result. When both run and the chunk replays a prefill graph, the chunk goes to a
        second stream (after everything queued before this step) so the GPU overlaps it with
        the decode graph; the decode stream then waits for it before the tokens come back. Else
        the decode graph is queued first, so that the GPU runs it while the host is still
        launching an eager chunk's kernels (host-bound: hundreds of launches).
        """
        inp = self.step_inputs
        n_prefill = inp.num_rows - num_decode
        segment = self._prefill_segment(inp, n_prefill) if n_prefill else None
        main = self.device.stream
        with self.device.activate():
            side = None
            if num_decode and n_prefill and self.overlap_prefill and self.use_graphs:
                if self._bucket(n_prefill) in self.prefill_graphs:
                    side = self.prefill_stream
                    self._step_ready.record(main)
                    side.wait_event(self._step_ready)
            if num_decode:
                self._issue_decode(inp, n_prefill, num_decode)
            if n_prefill:
                self._prefill(inp, n_prefill, segment, side if side is not None else main)
            if side is not None:
                self._prefill_done.record(side)
                main.wait_event(self._prefill_done)
            if num_decode:
                self._collect_decode(num_decode)

    def _prefill_segment(self, inp: StepInputs, n: int) -> tuple[int, int]:
        """(block-table row, first position) of the step's prompt chunk, checked before anything
        is queued (the prefill graph's attention reads them on the device, unchecked)."""
        seq, pos0 = int(inp.row_slot[0]), int(inp.row_pos[0])
        rows, cols = self.block_tables.shape
        if not (0 <= seq < rows and pos0 >= 0 and pos0 + n <= cols * self.kv.page_size):
            raise ValueError(f"prompt chunk of {n} rows at slot {seq}, position {pos0} is outside "
                             f"the block table ({rows} slots x {cols * self.kv.page_size} "
                             f"positions)")
        return seq, pos0

    def _prefill(self, inp: StepInputs, n: int, segment: tuple[int, int], stream) -> None:
        """The chunk's rows uploaded on `stream` and its prefill graph replayed there; without
        a graph (`stream` is then the device stream) its kernels are launched eagerly."""
        bucket = self._bucket(n)
        self._upload_prefill_rows(inp, n, bucket, segment, stream)
        graph = self.prefill_graphs.get(bucket) if self.use_graphs else None
        if graph is not None:
            graph.launch(stream)
            return
        self.prefill_forward(self._prefill_context(bucket, segment))

    def _upload_prefill_rows(self, inp: StepInputs, n: int, bucket: int,
                             segment: tuple[int, int], stream) -> None:
        """The chunk's n rows (the first n of `inp`), padded to `bucket`, to the prefill device
        buffers on `stream`."""
        rows = self.prefill_rows
        rows.ids[:n].set(inp.ids[:n], stream=stream)  # padding rows keep earlier (valid) ids
        rows.row_pos[:n].set(inp.row_pos[:n], stream=stream)
        pos = self._pad_positions[: 3 * bucket].reshape(3, bucket)
        pos[:, :n] = inp.positions[:, :n]
        rows.positions_flat[: 3 * bucket].set(self._pad_positions[: 3 * bucket], stream=stream)
        slots = self._pad_slots[:bucket]
        slots[:n] = inp.row_slot[:n]
        rows.row_slot[:bucket].set(slots, stream=stream)  # -1: padding rows write no KV
        slots[:n] = -1
        self._seg_host[1] = n
        rows.seg_starts[:2].set(self._seg_host, stream=stream)
        rows.seg_slots[:1].set(inp.seg_slots[:1], stream=stream)
        self._segment_host[:] = (segment[0], segment[1], n)
        rows.segment.set(self._segment_host, stream=stream)

    def _prefill_context(self, bucket: int, segment: tuple[int, int]) -> StepContext:
        return self.prefill_rows.context(bucket, 1, self.block_tables, slice(bucket, bucket),
                                         segment, segment_uploaded=True)

    def _bucket(self, n: int) -> int:
        """Rows a prompt chunk of n rows runs with: the smallest prefill bucket >= n (n itself
        when the model has no prefill graphs)."""
        for size in reversed(self.prefill_buckets):
            if size >= n:
                return size
        return n

    def capture_prefill_graphs(self) -> None:
        """Warm up and capture one prefill graph per bucket on the scratch slot (no KV writes);
        a failed capture leaves that bucket eager (logged)."""
        if not self.prefill_buckets:
            return
        with self.device.activate():
            self._capture_prefill_buckets()

    def _capture_prefill_buckets(self) -> None:
        from ninfer.core.cuda.graph import CudaGraph

        scratch = self.scratch_slot
        inp = StepInputs(self.prefill_chunk, max_segments=1)
        for bucket in self.prefill_buckets:
            inp.reset()
            inp.add_segment(scratch, [0] * bucket, 0)
            inp.row_slot[:bucket] = -1  # no KV writes (the scratch row's pages are not its own)
            self.states.zero(scratch)
            self._upload_prefill_rows(inp, bucket, bucket, (scratch, 0), self.device.stream)
            ctx = self._prefill_context(bucket, (scratch, 0))
            self.prefill_forward(ctx)  # warm-up: kernel compilation, cuBLAS heuristics
            graph = CudaGraph(f"prefill_n{bucket}")
            try:
                with graph.capture(self.device.stream):
                    self.prefill_forward(ctx)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: stay eager
                _log.warning("prefill graph capture (%d rows) failed (%s: %s); such chunks stay "
                             "eager", bucket, type(exc).__name__, exc)
                graph.destroy()
                continue
            self.prefill_graphs[bucket] = graph
        self.states.zero(scratch)

    def _load_decode_inputs(self, inp: StepInputs, start: int, b: int) -> None:
        rows, stream = self.decode_rows, self.device.stream
        end = start + b
        rows.ids[:b].set(inp.ids[start:end], stream=stream)
        rows.positions(b).set(np.ascontiguousarray(inp.positions[:, start:end]), stream=stream)
        rows.row_slot[:b].set(inp.row_slot[start:end], stream=stream)
        rows.row_pos[:b].set(inp.row_pos[start:end], stream=stream)
        rows.seg_slots[:b].set(inp.row_slot[start:end], stream=stream)
        host = self.sampler_inputs
        for f in _SAMPLER_FIELDS:
            self.sampler_dev[f][:b].set(getattr(host, f)[:b], stream=stream)
        self.pen_offsets[: b + 1].set(host.pen_offsets[: b + 1], stream=stream)
        if self._top_count_host[0] != host.num_top:  # uploaded only when it changes
            self._top_count_host[0] = host.num_top
            self.top_count_dev.set(self._top_count_host, stream=stream)
        m = len(host.pen_tokens)
        if m > self.pen_capacity:
            raise RuntimeError(
                f"{m} penalty entries exceed the device buffer ({self.pen_capacity})")
        if m:
            self.pen_tokens[:m].set(host.pen_tokens, stream=stream)
            self.pen_counts[:m].set(host.pen_counts, stream=stream)

    def _decode_body(self, b: int) -> None:
        """The decode step of B rows on fixed buffers: what each graph captures."""
        ctx = self.decode_rows.context(b, b, self.block_tables, slice(0, b))
        logits = self.decode_forward(ctx)
        d = self.sampler_dev
        ops.sample(logits, d["temperature"][:b], d["top_k"][:b], d["top_p"][:b], d["min_p"][:b],
                   d["repetition_penalty"][:b], d["presence_penalty"][:b],
                   d["frequency_penalty"][:b], d["seeds"][:b], d["counters"][:b],
                   self.pen_offsets[: b + 1], self.pen_tokens, self.pen_counts,
                   self.tokens_dev[:b], self.logprobs_dev[:b], self.top_ids_dev[:b],
                   self.top_lp_dev[:b], workspace=self.decode_kws.sample_scratch,
                   top_count=self.top_count_dev)

    def _issue_decode(self, inp: StepInputs, start: int, b: int) -> None:
        self._load_decode_inputs(inp, start, b)
        graph = self.graphs.get(b) if self.use_graphs else None
        if graph is not None:
            graph.launch(self.device.stream)
        else:
            self._decode_body(b)

    def _collect_decode(self, b: int) -> None:
        """Download the sampled tokens (blocks until the stream has run them)."""
        host, stream = self.sampler_inputs, self.device.stream
        self.tokens_dev[:b].get(stream=stream, out=host.tokens[:b])
        self.logprobs_dev[:b].get(stream=stream, out=host.logprobs[:b])
        if host.num_top:
            host.top_ids[:b] = self.top_ids_dev[:b].get(stream=stream)
            host.top_logprobs[:b] = self.top_lp_dev[:b].get(stream=stream)
        stream.synchronize()

    # -- graphs ----------------------------------------------------------------------------
    def capture_graphs(self) -> None:
        """Warm up and capture one decode graph per batch size 1..max_batch, then the prefill
        graphs (capture_prefill_graphs)."""
        from ninfer.core.cuda.graph import CudaGraph

        with self.device.activate():
            for b in range(1, self.max_batch + 1):
                self._decode_body(b)  # warm-up: compiles kernels, touches every buffer
            self.device.synchronize()
            for b in range(1, self.max_batch + 1):
                graph = CudaGraph(f"decode_b{b}")
                with graph.capture(self.device.stream):
                    self._decode_body(b)
                self.graphs[b] = graph
            self.capture_prefill_graphs()
            self.device.synchronize()

    def destroy_graphs(self) -> None:
        for graph in self.graphs.values():
            graph.destroy()
        self.graphs.clear()
        for graph in self.prefill_graphs.values():
            graph.destroy()
        self.prefill_graphs.clear()

    def last_logits(self, rows: int) -> np.ndarray:
        """A host copy of the last step's decode logits (tests and diagnostics)."""
        with self.device.activate():
            return self.cp.asnumpy(self.decode_ws.logits[:rows])

    def score(self, slot: int, token_ids: list[int], chunk: int) -> np.ndarray:
        """Logits f32[T, V] of every position (scoring path; allocates its own staging)."""
        cp = self.cp
        t = len(token_ids)
        out = np.empty((t, self.cfg.vocab_size), np.float32)
        with self.device.activate():
            ws = Workspace(self.cfg, chunk, chunk, xp=cp, bf16_operands=True)
            fwd = Qwen35Forward(self.cfg, self.params, ws, self.kv, self.states, xp=cp,
                                kernel_ws=dataclasses.replace(self.prefill_kws))
            rows = _DeviceRows.allocate(cp, chunk)
            for start in range(0, t, chunk):
                stop = min(t, start + chunk)
                n = stop - start
                pos = np.arange(start, stop, dtype=np.int32)
                rows.ids[:n].set(np.asarray(token_ids[start:stop], np.int32))
                rows.positions(n).set(np.ascontiguousarray(np.broadcast_to(pos, (3, n))))
                rows.row_slot[:n].fill(slot)
                rows.row_pos[:n].set(pos)
                rows.seg_starts[:2].set(np.array([0, n], np.int32))
                rows.seg_slots[:1].fill(slot)
                logits = fwd(rows.context(n, 1, self.block_tables, slice(0, n), (slot, start)))
                out[start:stop] = cp.asnumpy(logits)
        return out
