"""Protocols the runtime drives and the types that cross them.

- `program`: what a model Program offers the engine worker (units, PendingBatch, pause/resume).
- `sampling`: per-request sampling parameters (a frozen, validated dataclass).
- `output`: the OutputSession preview/commit protocol the frontend implements.
"""
from ninfer.runtime.contract.sampling import SamplingParams
from ninfer.runtime.contract.program import (
    Capacity,
    PendingBatch,
    PendingRow,
    PrefillChunk,
    Program,
    ProgramLimits,
    ResumeKind,
    ResumeState,
    RowDecision,
    SequenceId,
    StepPlan,
    TopLogprob,
)
from ninfer.runtime.contract.output import OutputPreview, OutputSession

__all__ = [
    "Capacity", "OutputPreview", "OutputSession", "PendingBatch", "PendingRow", "PrefillChunk",
    "Program", "ProgramLimits", "ResumeKind", "ResumeState", "RowDecision", "SamplingParams",
    "SequenceId", "StepPlan", "TopLogprob",
]
