"""Drive a QwenOutputSession the way the engine worker does, in arbitrary token chunks."""
from __future__ import annotations

import dataclasses
import json
from typing import Iterator, Sequence

from ninfer.models.common.qwen import OutputDelta


@dataclasses.dataclass
class Streamed:
    """The concatenation of a session's deltas."""

    content: str = ""
    reasoning: str = ""
    calls: dict = dataclasses.field(default_factory=dict)  # index -> [id, name, arguments]
    token_ids: list = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    deltas: int = 0

    def add(self, delta: OutputDelta) -> None:
        assert self.finish_reason is None, "a delta after the final one"
        assert "\ufffd" not in delta.content + delta.reasoning, "a broken UTF-8 sequence"
        self.deltas += 1
        self.content += delta.content
        self.reasoning += delta.reasoning
        for call in delta.tool_calls:
            if call.id is not None:
                assert call.index == len(self.calls), "call indices must count 0, 1, ..."
                assert call.name  # the first delta of a call names it (arguments may follow)
                self.calls[call.index] = [call.id, call.name, ""]
            else:
                assert call.index in self.calls and call.name is None
            self.calls[call.index][2] += call.arguments
        self.token_ids.extend(delta.token_ids)
        assert len(delta.logprobs) == len(delta.token_ids)
        self.finish_reason = delta.finish_reason

    def parsed_calls(self) -> list[tuple[str, dict]]:
        return [(name, json.loads(args)) for _, (cid, name, args) in sorted(self.calls.items())]


def run_chunks(session, ids: Sequence[int], chunks: Sequence[int], *, end_reason: str = "length",
               decoy: Sequence[int] = ()) -> Streamed:
    """Feed `ids` in chunks of the given sizes (preview -> commit each); if the session does
    not stop itself, end with `finish(end_reason)`. A `decoy` chunk is previewed and dropped
    before every real preview, as the engine does when a Program commit fails."""
    out = Streamed()
    pos = 0
    for size in chunks:
        chunk = list(ids[pos: pos + size])
        if not chunk:
            break
        if decoy:
            session.preview(list(decoy), [-1.0] * len(decoy))  # never committed
        preview = session.preview(chunk, [-0.25] * len(chunk))
        assert 1 <= preview.accepted <= len(chunk)
        if preview.finish_reason is None:
            assert preview.accepted == len(chunk)
        delta = session.commit(preview)
        if delta is not None:
            out.add(delta)
        pos += preview.accepted
        if preview.finish_reason is not None:
            assert preview.finish_reason == "stop"
            assert out.finish_reason is not None
            return out
    final = session.finish(end_reason)
    assert final is not None and final.finish_reason is not None
    out.add(final)
    return out


def chunkings(n: int) -> Iterator[tuple[int, ...]]:
    """Every fixed group size 1..n, then every two-piece split point."""
    for size in range(1, n + 1):
        yield (size,) * (-(-n // size))
    for cut in range(1, n):
        yield (cut, n - cut)
