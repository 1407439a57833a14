"""Per-sequence bookkeeping of the Qwen3.5 Program: the token ledger and the resources held.

Ledger model (ninfer/runtime/contract/program.py): `ledger` = prompt + accepted outputs;
`frontier` = ledger tokens already fed through the model. Prefill chunks feed ledger[frontier:
len-1] at absolute chunk boundaries; a decode unit feeds ledger[-1] and samples one token.
"""
from __future__ import annotations

import dataclasses
import enum

from ninfer.runtime.contract import SamplingParams


class SeqPhase(enum.Enum):
    LIVE = "live"  # may be planned
    PENDING = "pending"  # member of an unconsumed PendingBatch
    CLOSED = "closed"  # cancelled row committed with 0 accepted: only release() is legal


@dataclasses.dataclass(eq=False)
class SequenceRecord:
    seq_id: int
    ledger: list[int]
    prompt_len: int
    sampling: SamplingParams
    frontier: int = 0
    slot: int | None = None
    pages: list[int] = dataclasses.field(default_factory=list)
    # occurrences of each token in the output (frequency/presence penalties)
    out_counts: dict[int, int] = dataclasses.field(default_factory=dict)
    phase: SeqPhase = SeqPhase.LIVE

    @property
    def num_output(self) -> int:
        """Accepted output tokens; also the sampling counter of the next draw."""
        return len(self.ledger) - self.prompt_len

    @property
    def pending_prefill(self) -> int:
        return max(0, len(self.ledger) - 1 - self.frontier)

    def next_chunk_len(self, chunk: int) -> int:
        """Tokens of the next prefill chunk: up to the next multiple of `chunk`, or len-1."""
        if self.pending_prefill == 0:
            return 0
        boundary = (self.frontier // chunk + 1) * chunk
        return min(len(self.ledger) - 1, boundary) - self.frontier

    def accept(self, token: int) -> None:
        self.ledger.append(token)
        self.out_counts[token] = self.out_counts.get(token, 0) + 1

    @property
    def uses_penalties(self) -> bool:
        s = self.sampling
        return (s.repetition_penalty != 1.0 or s.presence_penalty != 0.0
                or s.frequency_penalty != 0.0)

    def penalty_entries(self) -> tuple[list[int], list[int]]:
        """(unique tokens of prompt + output, their output counts) for the sampler."""
        counts = dict.fromkeys(self.ledger[: self.prompt_len], 0)
        counts.update(self.out_counts)
        return list(counts.keys()), list(counts.values())


@dataclasses.dataclass(eq=False)
class ReplayPayload:
    """What a paused sequence keeps when it must re-execute its history."""

    ledger: list[int]
    prompt_len: int
    sampling: SamplingParams
    out_counts: dict[int, int]


@dataclasses.dataclass(eq=False)
class SnapshotPayload:
    """A Replay payload plus a host copy of the state image and the KV of positions < frontier."""

    replay: ReplayPayload
    frontier: int
    state_image: object  # host array, one StateImage
    kv_blocks: object  # host array [attn_layers, 2, pages, Hkv, page_size, D]
