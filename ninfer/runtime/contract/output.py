"""The OutputSession protocol: how a request's output semantics see model tokens.

The engine worker owns the order (seed: "Frontend preview -> Program commit -> budget ->
OutputSession commit -> publish"):

1. `preview(token_ids, logprobs)` with the provisional tokens of one PendingBatch row. The
   session decides, without changing its visible state, how many tokens to accept and whether
   the request ends (a stop token id, a stop string). Tokens after a terminal token are not
   accepted.
2. The engine commits the Program batch. If that fails, the preview is dropped (never committed).
3. `commit(preview)` makes the preview the session's state and returns the delta to publish
   (opaque to the runtime; None when nothing is visible yet, e.g. held-back text).
4. When the request ends for a reason the session did not decide (length, cancellation,
   deadline), the engine calls `finish(reason)`, which returns the final delta (held-back text
   that is now safe to emit) or None.

The session is used by the engine worker thread only. A Replay never previews again: tokens
rebuilt from the ledger are not shown to the session.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(frozen=True, slots=True)
class OutputPreview:
    accepted: int  # tokens of the row to keep; 1 <= accepted <= produced for a live row
    finish_reason: str | None  # "stop" when the session ends the request, else None
    payload: Any = None  # private to the session; handed back to commit()


@runtime_checkable
class OutputSession(Protocol):
    def preview(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> OutputPreview: ...

    def commit(self, preview: OutputPreview) -> Any: ...

    def finish(self, finish_reason: str) -> Any: ...


class TokenOutputSession:
    """The minimal session: tokens only, stops at any of `stop_token_ids`.

    Its deltas are tuples of accepted token ids. Used by the CLI's --prompt-ids path and by
    runtime tests; the Qwen frontend provides the text-aware session.
    """

    def __init__(self, stop_token_ids: Sequence[int] = ()):
        self._stop = frozenset(int(t) for t in stop_token_ids)
        self.token_ids: list[int] = []

    def preview(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> OutputPreview:
        for i, tok in enumerate(token_ids):
            if tok in self._stop:
                return OutputPreview(i + 1, "stop", tuple(token_ids[: i + 1]))
        return OutputPreview(len(token_ids), None, tuple(token_ids))

    def commit(self, preview: OutputPreview) -> Any:
        self.token_ids.extend(preview.payload)
        return preview.payload

    def finish(self, finish_reason: str) -> Any:
        return None
