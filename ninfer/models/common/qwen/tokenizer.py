"""QwenTokenizer: the byte-level BPE tokenizer of the Qwen3.5 family.

Wraps a Hugging Face `tokenizers.Tokenizer` built from tokenizer.json text (the artifact carries
it as a resource). Adds what the frontend needs on top of encode/decode: the raw bytes of one
token (for incremental detokenization), the named special tokens, and strict id checking.

Ids are plain Python ints. An id is valid when 0 <= id < vocab_size and the tokenizer maps it
to a token; anything else raises `InvalidInput`.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders

from ninfer.errors import ArtifactError, InvalidInput

__all__ = ["QwenTokenizer", "SpecialTokens"]


def _byte_level_table() -> dict[int, int]:
    """GPT-2 byte-level alphabet inverted: code point of a vocab char -> the byte it stands for."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    byte_of: dict[int, int] = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in byte_of:
            byte_of[256 + extra] = b
            extra += 1
    return byte_of


# str.translate table: each byte-level char -> the char whose code point is its byte, so that
# `.encode("latin-1")` yields the token's raw bytes.
_TO_LATIN1 = {cp: chr(b) for cp, b in _byte_level_table().items()}


@dataclasses.dataclass(frozen=True, slots=True)
class SpecialTokens:
    """Ids of the special tokens the frontend relies on."""

    endoftext: int  # <|endoftext|>
    im_start: int  # <|im_start|>
    im_end: int  # <|im_end|>
    think: int  # <think>
    think_end: int  # </think>
    tool_call: int  # <tool_call>
    tool_call_end: int  # </tool_call>


_SPECIAL_TEXT = (
    ("endoftext", "<|endoftext|>"),
    ("im_start", "<|im_start|>"),
    ("im_end", "<|im_end|>"),
    ("think", "<think>"),
    ("think_end", "</think>"),
    ("tool_call", "<tool_call>"),
    ("tool_call_end", "</tool_call>"),
)


class QwenTokenizer:
    """Read-only tokenizer; safe to share between threads and requests.

    - `encode(text)` adds no BOS and parses special-token text (e.g. ``<|im_start|>``) into
      its id, as chat-template output needs.
    - `decode(ids, skip_special_tokens)` is the reference text of a whole id sequence.
    - `token_bytes(id)` is the raw byte string one token stands for (special tokens: their
      UTF-8 text), so that concatenating token_bytes and decoding as UTF-8 with replacement
      equals `decode(ids, skip_special_tokens=False)`.
    """

    def __init__(self, tokenizer_json: str):
        try:
            self._tok = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # the tokenizers library raises bare Exceptions
            raise ArtifactError(f"tokenizer.json cannot be loaded: {exc}") from exc
        if not isinstance(self._tok.decoder, decoders.ByteLevel):
            raise ArtifactError(
                "tokenizer.json: expected a ByteLevel decoder, got "
                f"{type(self._tok.decoder).__name__}"
            )
        added = self._tok.get_added_tokens_decoder()
        self._added: dict[int, str] = {int(i): t.content for i, t in added.items()}
        self._special_ids = frozenset(int(i) for i, t in added.items() if t.special)
        base = self._tok.get_vocab_size(with_added_tokens=False)
        self._vocab_size = max([base - 1, *self._added]) + 1
        self._bytes_cache: dict[int, bytes] = {}
        ids = {}
        for field, text in _SPECIAL_TEXT:
            tid = self._tok.token_to_id(text)
            if tid is None:
                raise ArtifactError(f"tokenizer.json lacks the special token {text!r}")
            ids[field] = tid
        self.special = SpecialTokens(**ids)

    @property
    def vocab_size(self) -> int:
        """One past the largest id the tokenizer knows (holes, if any, are rejected too)."""
        return self._vocab_size

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids the tokenizer marks special (dropped by skip_special_tokens)."""
        return self._special_ids

    def token_id(self, text: str) -> int:
        """Id of a token given its exact text (e.g. ``"<|im_end|>"``)."""
        tid = self._tok.token_to_id(text)
        if tid is None:
            raise InvalidInput(f"unknown token {text!r}", param="token")
        return tid

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InvalidInput(f"text must be a string, got {type(text).__name__}", param="text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates cannot be tokenized
            raise InvalidInput(f"text is not valid Unicode (position {exc.start}: "
                               f"{exc.reason})", param="text") from None
        return self._tok.encode(text, add_special_tokens=False).ids

    def check_ids(self, ids: Iterable[int], *, param: str = "token_ids") -> list[int]:
        """Validate ids (integers the tokenizer knows; NumPy ints too) and return a list of int."""
        out = []
        for i, tid in enumerate(ids):
            try:
                if isinstance(tid, bool):
                    raise TypeError
                tid = operator.index(tid)
            except TypeError:
                raise InvalidInput(
                    f"{param}[{i}] must be an integer, got {tid!r}", param=param
                ) from None
            if not 0 <= tid < self._vocab_size or self._tok.id_to_token(tid) is None:
                raise InvalidInput(
                    f"{param}[{i}] = {tid} is outside the tokenizer's range "
                    f"[0, {self._vocab_size})",
                    param=param,
                )
            out.append(tid)
        return out

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        checked = self.check_ids(ids)
        return self._tok.decode(checked, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for; special tokens give their UTF-8 text."""
        if type(token_id) is int:  # the fast path; bools and other types go through checks
            cached = self._bytes_cache.get(token_id)
            if cached is not None:
                return cached
        (tid,) = self.check_ids([token_id], param="token_id")
        if tid in self._added:
            raw = self._added[tid].encode("utf-8")
        else:
            piece = self._tok.id_to_token(tid)
            try:
                raw = piece.translate(_TO_LATIN1).encode("latin-1")
            except UnicodeEncodeError:  # not a byte-level piece: take its text as is
                raw = piece.encode("utf-8")
        self._bytes_cache[tid] = raw
        return raw

    def token_text(self, token_id: int) -> str:
        """Display text of one token (invalid UTF-8 bytes replaced), e.g. for logprobs."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")
