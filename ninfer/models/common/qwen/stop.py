"""Stop strings and stop token ids.

Stop strings follow OpenAI semantics: output ends right before the first occurrence of any stop
string, which is not included. Text that could still become a stop string (a proper prefix of
one at the end of the output) is held back, so nothing is emitted and later retracted.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from ninfer.errors import InvalidInput
from ninfer.models.common.qwen.textscan import find_first, partial_suffix_len, shallow_clone

__all__ = ["StopStringMatcher", "validate_stop_strings", "stop_token_set"]

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 512


def validate_stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """Normalize a request's `stop` (None, one string or a list) to a tuple; reject bad ones."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)):
        raise InvalidInput("stop must be a string or a list of strings", param="stop")
    if len(items) > MAX_STOP_STRINGS:
        raise InvalidInput(f"at most {MAX_STOP_STRINGS} stop strings are allowed", param="stop")
    out = []
    for s in items:
        if not isinstance(s, str) or not s:
            raise InvalidInput("each stop string must be a non-empty string", param="stop")
        if len(s) > MAX_STOP_STRING_CHARS:
            raise InvalidInput(
                f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters", param="stop"
            )
        out.append(s)
    return tuple(dict.fromkeys(out))


def stop_token_set(
    eos_ids: Iterable[int], extra_ids: Iterable[int], *, ignore_eos: bool, vocab_size: int
) -> frozenset[int]:
    """Token ids that end a request: the model's EOS ids (unless ignore_eos) plus the request's."""
    extra = []
    for tid in extra_ids:
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < vocab_size:
            raise InvalidInput(
                f"stop_token_ids entries must be ids in [0, {vocab_size}), got {tid!r}",
                param="stop_token_ids",
            )
        extra.append(tid)
    base = () if ignore_eos else tuple(eos_ids)
    return frozenset(base) | frozenset(extra)


class StopStringMatcher:
    """Streaming stop-string matcher; `clone()` is cheap (immutable fields)."""

    def __init__(self, stops: tuple[str, ...]):
        self._stops = stops
        self._held = ""

    def clone(self) -> "StopStringMatcher":
        return shallow_clone(self)

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string matched).

        After a match the returned text ends right before the stop string, and the matcher
        must not be fed again.
        """
        if not self._stops:
            return text, False
        buf = self._held + text
        at, _ = find_first(buf, self._stops)
        if at >= 0:
            self._held = ""
            return buf[:at], True
        keep = partial_suffix_len(buf, self._stops)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """End of output without a match: the held-back text is plain output after all."""
        held, self._held = self._held, ""
        return held
