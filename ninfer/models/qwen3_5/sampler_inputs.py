"""Host-side per-row sampling parameters of one decode batch, preallocated for `max_batch` rows."""
from __future__ import annotations

import numpy as np

from ninfer.models.qwen3_5.sequences import SequenceRecord

MAX_TOP_LOGPROBS = 20


class SamplerInputs:
    def __init__(self, max_batch: int):
        b = max_batch
        self.temperature = np.zeros(b, np.float32)
        self.top_k = np.zeros(b, np.int32)
        self.top_p = np.ones(b, np.float32)
        self.min_p = np.zeros(b, np.float32)
        self.repetition_penalty = np.ones(b, np.float32)
        self.presence_penalty = np.zeros(b, np.float32)
        self.frequency_penalty = np.zeros(b, np.float32)
        self.seeds = np.zeros(b, np.uint64)
        self.counters = np.zeros(b, np.int64)
        self.pen_offsets = np.zeros(b + 1, np.int32)
        self.pen_tokens = np.zeros(0, np.int32)
        self.pen_counts = np.zeros(0, np.int32)
        self.tokens = np.zeros(b, np.int32)
        self.logprobs = np.zeros(b, np.float32)
        self.top_ids = np.zeros((b, MAX_TOP_LOGPROBS), np.int32)
        self.top_logprobs = np.zeros((b, MAX_TOP_LOGPROBS), np.float32)
        self.num_rows = 0
        self.num_top = 0
        # the SamplingParams object each row's fixed parameters were written from: a row whose
        # sequence keeps its place (the usual decode step) only updates its counter
        self._row_params: list[object] = [None] * b

    def fill(self, records: list[SequenceRecord]) -> None:
        """Load the rows' parameters; penalty entries only for rows that use penalties."""
        self.num_rows = len(records)
        self.num_top = max((r.sampling.top_logprobs for r in records), default=0)
        tokens: list[int] = []
        counts: list[int] = []
        for i, r in enumerate(records):
            s = r.sampling
            if self._row_params[i] is not s:
                self.temperature[i] = s.temperature
                self.top_k[i] = s.top_k
                self.top_p[i] = s.top_p
                self.min_p[i] = s.min_p
                self.repetition_penalty[i] = s.repetition_penalty
                self.presence_penalty[i] = s.presence_penalty
                self.frequency_penalty[i] = s.frequency_penalty
                self.seeds[i] = np.uint64(s.seed)
                self._row_params[i] = s
            self.counters[i] = r.num_output
            self.pen_offsets[i] = len(tokens)
            if r.uses_penalties:
                t, c = r.penalty_entries()
                tokens.extend(t)
                counts.extend(c)
        self.pen_offsets[len(records)] = len(tokens)
        if tokens or len(self.pen_tokens):
            self.pen_tokens = np.asarray(tokens, np.int32)
            self.pen_counts = np.asarray(counts, np.int32)

    def row_arrays(self) -> dict:
        """Keyword arguments for `ops.sample` (views of the first num_rows rows)."""
        b, t = self.num_rows, self.num_top
        return dict(
            temperature=self.temperature[:b], top_k=self.top_k[:b], top_p=self.top_p[:b],
            min_p=self.min_p[:b], repetition_penalty=self.repetition_penalty[:b],
            presence_penalty=self.presence_penalty[:b], frequency_penalty=self.frequency_penalty[:b],
            seeds=self.seeds[:b], counters=self.counters[:b], pen_offsets=self.pen_offsets[: b + 1],
            pen_tokens=self.pen_tokens, pen_counts=self.pen_counts, tokens_out=self.tokens[:b],
            logprobs_out=self.logprobs[:b], top_ids_out=self.top_ids[:b, :t],
            top_logprobs_out=self.top_logprobs[:b, :t],
        )
