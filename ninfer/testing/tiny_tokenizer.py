"""A tiny deterministic byte-level BPE tokenizer (tokenizer.json) for random test checkpoints.

Ids 0..255 are the 256 byte symbols (GPT-2 byte-to-unicode alphabet, id = byte value), then BPE
merges learned from a fixed multilingual corpus (ties broken lexicographically, so the result
is identical on every machine), then the ChatML / Qwen special tokens. Every string encodes
(unknown text falls back to bytes) and decodes back exactly.
"""
from __future__ import annotations

import collections
import functools
import json
import re

from ninfer.errors import InvalidInput

SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A language model predicts the next token from the
previous ones; it reads the prompt, then writes an answer one token at a time. Hello, world!
How are you today? I am fine, thank you. What is the weather like in the city this morning?
def main(args):
    for index, value in enumerate(args):
        if value is not None:
            print(f"{index}: {value}")
    return 0
import numpy as np
x = np.zeros((4, 8), dtype=np.float32)
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026 3.14159
你好，世界！今天天气很好。我们一起学习语言模型。
Bonjour le monde, ceci est un petit test. Hallo Welt, das ist ein kleiner Test.
<think>
The user greets me; I should answer politely.
</think>
<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
</function>
</tool_call>
"""
_WORD = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+")


@functools.lru_cache(maxsize=1)
def _byte_alphabet() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable unicode map (the ByteLevel pre-tokenizer's)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def _learn_merges(num_merges: int) -> list[tuple[str, str]]:
    alphabet = _byte_alphabet()
    words = collections.Counter(
        tuple(alphabet[b] for b in w.encode("utf-8")) for w in _WORD.findall(_CORPUS))
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: collections.Counter = collections.Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        merged = collections.Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def build_tiny_tokenizer_json(vocab_size: int) -> str:
    """tokenizer.json text with at most `vocab_size` tokens (specials last)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    regular = vocab_size - len(SPECIAL_TOKENS)
    if regular < 256:
        raise InvalidInput(f"vocab_size {vocab_size} is too small for the tiny tokenizer "
                           f"(needs >= {256 + len(SPECIAL_TOKENS)})")
    vocab = {sym: i for i, sym in enumerate(_byte_alphabet())}
    merges = _learn_merges(regular - 256)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok.to_str()


def special_token_ids(tokenizer_json: str) -> dict[str, int]:
    """content -> id of every added token in a tokenizer.json."""
    data = json.loads(tokenizer_json)
    return {t["content"]: t["id"] for t in data.get("added_tokens", [])}


def num_token_ids(tokenizer_json: str) -> int:
    """1 + the largest id a tokenizer.json can produce (model vocab and added tokens)."""
    data = json.loads(tokenizer_json)
    ids = [t["id"] for t in data.get("added_tokens", [])]
    vocab = (data.get("model") or {}).get("vocab") or {}
    ids += list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]
    return max(ids, default=-1) + 1
