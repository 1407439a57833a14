"""Incremental detokenization: token ids in, complete UTF-8 text out.

A byte-level BPE token may hold part of a multi-byte character. The detokenizer keeps the
bytes of an incomplete (but still valid) UTF-8 sequence until the next token completes it, and
decodes invalid bytes to U+FFFD exactly as the tokenizer's own decode does (maximal-subpart
replacement), so that for any ids the concatenated output equals
``tokenizer.decode(ids, skip_special_tokens=...)``.
"""
from __future__ import annotations

import codecs
from typing import Callable, FrozenSet

from ninfer.models.common.qwen.textscan import shallow_clone

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    """Per-request detokenizer state; `clone()` is cheap (all fields are immutable).

    `token_bytes` maps an id to its raw bytes. Ids in `skip_ids` produce no text (skipped
    special tokens; the bytes of an incomplete character carry across them, as in a whole
    decode). Ids that `token_bytes` rejects (outside the tokenizer, e.g. padded embedding rows)
    produce no text either: the output stream must not fail on a model's choice.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], skip_ids: FrozenSet[int] = frozenset()):
        self._token_bytes = token_bytes
        self._skip_ids = skip_ids
        self._pending = b""

    def clone(self) -> "IncrementalDetokenizer":
        return shallow_clone(self)

    @property
    def pending_bytes(self) -> int:
        """Bytes held back as the start of an incomplete character."""
        return len(self._pending)

    def feed(self, token_id: int) -> str:
        """Append one token; return the text it completes (possibly empty)."""
        if token_id in self._skip_ids:
            return ""
        try:
            raw = self._token_bytes(token_id)
        except ValueError:
            return ""
        data = self._pending + raw
        text, used = codecs.utf_8_decode(data, "replace", False)
        self._pending = data[used:]
        return text

    def flush(self) -> str:
        """End of output: an incomplete trailing character becomes U+FFFD."""
        if not self._pending:
            return ""
        text, _ = codecs.utf_8_decode(self._pending, "replace", True)
        self._pending = b""
        return text
