"""The CPU backend of the Qwen3.5 Program: NumPy storage, Numba kernels, host sampling.

It owns the physical stores (paged KV pool, StateImage slots, the persistent block-table matrix)
and executes one step's rows: forward over every row, then sampling of the decode rows.
"""
from __future__ import annotations

import numpy as np

from ninfer import ops
from ninfer.core.dtypes import DType
from ninfer.core.kv_pool import PageAllocator, PagedKVPool
from ninfer.core.state_image import GdnStateShape, StateImageLayout, StateImageStorage
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.forward import Qwen35Forward, StepContext
from ninfer.models.qwen3_5.parameters import Parameters
from ninfer.models.qwen3_5.stores import BackendStores
from ninfer.models.qwen3_5.sampler_inputs import SamplerInputs
from ninfer.models.qwen3_5.workspace import StepInputs, Workspace


def state_image_layout(cfg: Qwen35Config) -> StateImageLayout:
    """Every GDN layer's conv [Kc-1, C] and recurrent [Hv, dk, dv] state, in layer order."""
    shape = GdnStateShape(cfg.linear_conv_kernel_dim, cfg.conv_channels,
                          cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                          cfg.linear_value_head_dim)
    return StateImageLayout.uniform(len(cfg.linear_attention_layers), shape)


class CpuBackend(BackendStores):
    def __init__(self, cfg: Qwen35Config, params: Parameters, *, num_pages: int, page_size: int,
                 num_slots: int, max_batch: int, prefill_chunk: int, max_context_len: int,
                 kv_dtype: DType = DType.FLOAT32):
        self.cfg = cfg
        max_rows = prefill_chunk + max_batch
        self.kv = PagedKVPool(len(cfg.full_attention_layers), num_pages,
                              cfg.num_key_value_heads, page_size, cfg.head_dim, kv_dtype, xp=np)
        self.pages = PageAllocator(num_pages)
        self.states = StateImageStorage(state_image_layout(cfg), num_slots, xp=np)
        max_pages = -(-max_context_len // page_size)
        self.block_tables = np.zeros((num_slots, max_pages), np.int32)
        self.step_inputs = StepInputs(max_rows, max_segments=max_batch + 1)
        self.sampler_inputs = SamplerInputs(max_batch)
        self.params = params
        self.workspace = Workspace(cfg, max_rows, max_batch, xp=np)
        self.forward = Qwen35Forward(cfg, params, self.workspace, self.kv, self.states, xp=np)

    # -- slots and pages -------------------------------------------------------------------
    def zero_state(self, slot: int) -> None:
        self.states.zero(slot)

    def set_block_table(self, slot: int, pages: list[int]) -> None:
        self.block_tables[slot, : len(pages)] = pages

    # -- snapshots -------------------------------------------------------------------------
    def copy_out_state(self, slot: int) -> np.ndarray:
        return self.states.copy_out(slot)

    def copy_in_state(self, slot: int, image: np.ndarray) -> None:
        self.states.copy_in(slot, image)

    def copy_out_kv(self, pages: list[int], tokens: int) -> np.ndarray:
        """Host copy [attn_layers, 2, P, Hkv, page_size, D] of the pages covering [0, tokens)."""
        used = np.asarray(pages[: -(-tokens // self.kv.page_size)], np.int64)
        return np.stack([np.stack([k[used], v[used]]) for k, v in zip(self.kv.k, self.kv.v)])

    def copy_in_kv(self, pages: list[int], blocks: np.ndarray) -> None:
        ids = np.asarray(pages[: blocks.shape[2]], np.int64)
        for layer, (k, v) in enumerate(zip(self.kv.k, self.kv.v)):
            k[ids] = blocks[layer, 0]
            v[ids] = blocks[layer, 1]

    # -- execution -------------------------------------------------------------------------
    def _context(self, inp: StepInputs, logit_rows: slice) -> StepContext:
        n = inp.num_rows
        return StepContext(
            ids=inp.ids[:n], positions=inp.packed_positions(), row_slot=inp.row_slot[:n],
            row_pos=inp.row_pos[:n], seg_starts=inp.seg_starts[: inp.num_segments + 1],
            seg_slots=inp.seg_slots[: inp.num_segments], block_tables=self.block_tables,
            logit_rows=logit_rows,
        )

    def execute(self, num_decode: int) -> None:
        """Forward over the step's rows; sample the last `num_decode` rows into sampler_inputs."""
        n = self.step_inputs.num_rows
        logits = self.forward(self._context(self.step_inputs, slice(n - num_decode, n)))
        if num_decode:
            ops.sample(logits, **self.sampler_inputs.row_arrays())

    def last_logits(self, rows: int) -> np.ndarray:
        """A host copy of the last step's decode logits (tests and diagnostics)."""
        return self.workspace.logits[:rows].copy()

    def score(self, slot: int, token_ids: list[int], chunk: int) -> np.ndarray:
        """Logits f32[T, V] of every position of `token_ids` fed from position 0 in `slot`.

        Allocates its own staging (scoring is not on the serving path).
        """
        t = len(token_ids)
        ws = Workspace(self.cfg, chunk, chunk, xp=np)
        forward = Qwen35Forward(self.cfg, self.params, ws, self.kv, self.states, xp=np)
        inputs = StepInputs(chunk, max_segments=1)
        out = np.empty((t, self.cfg.vocab_size), np.float32)
        for start in range(0, t, chunk):
            stop = min(t, start + chunk)
            inputs.reset()
            inputs.add_segment(slot, token_ids[start:stop], start)
            out[start:stop] = forward(self._context(inputs, slice(0, stop - start)))
        return out
