"""Qwen3.5 CPU backend vs Hugging Face transformers on the same random weights (fp32, eager).

Configs (ninfer.testing.checkpoints presets) cover Hv/Hk > 1 grouping, tied and untied
embeddings, two layer_types patterns, and MoE with top-k > 1.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.runtime.contract import SamplingParams
from tests.models.qwen35_cases import (
    ARCH, build_case, generate, load_hf, open_program, prompts, rel_err,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(ARCH))
def case(request, tmp_path_factory):
    c = build_case(tmp_path_factory.mktemp(request.param), request.param)
    return c, load_hf(c), open_program(c)


def test_prompt_logits_match_transformers(case):
    c, hf, program = case
    (prompt,) = prompts(c.vocab_size, [37], seed=1)
    ours = program.prompt_logits(prompt)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].numpy()
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) < 1e-4


def test_greedy_64_tokens_match_transformers(case):
    c, hf, program = case
    (prompt,) = prompts(c.vocab_size, [11], seed=2)
    (gen,) = generate(program, [prompt], 64)
    with torch.no_grad():
        # eos_token_id=None: both sides ignore EOS (a min_new_tokens processor would mask it)
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False,
                          eos_token_id=None, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True)
    ref_tokens = out.sequences[0, len(prompt):].tolist()
    assert gen.tokens == ref_tokens
    ref_lp = [torch.log_softmax(step[0].double(), -1)[t].item()
              for step, t in zip(out.logits, ref_tokens)]
    assert np.max(np.abs(np.array(gen.logprobs) - np.array(ref_lp))) < 1e-4


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_equals_whole_prefill(case, chunk):
    c, _, program = case
    (prompt,) = prompts(c.vocab_size, [45], seed=3)
    (whole,) = generate(program, [prompt], 3, keep_logits=True)  # chunk 16 < 45: fixture's chunking
    single = open_program(c, prefill_chunk=1000)
    (ref,) = generate(single, [prompt], 3, keep_logits=True)
    chunked = open_program(c, prefill_chunk=chunk)
    (got,) = generate(chunked, [prompt], 3, keep_logits=True)
    for a, b, w in zip(got.logits, ref.logits, whole.logits):
        np.testing.assert_array_equal(a, b)  # bitwise: chunk boundaries change nothing
        np.testing.assert_array_equal(w, b)
    assert got.tokens == ref.tokens


def test_decode_after_prefill_equals_full_forward(case):
    c, _, program = case
    (prompt,) = prompts(c.vocab_size, [20], seed=4)
    (gen,) = generate(program, [prompt], 6, keep_logits=True)
    full = program.prompt_logits(prompt + gen.tokens[:-1])
    # decode step i's logits predict token i from prompt + tokens[:i]
    for i, step_logits in enumerate(gen.logits):
        assert rel_err(step_logits, full[len(prompt) - 1 + i]) < 1e-6


def test_batch_of_4_equals_single_runs(case):
    c, _, program = case
    plist = prompts(c.vocab_size, [3, 17, 30, 9], seed=5)
    batched = generate(program, plist, 12)
    for p, b in zip(plist, batched):
        (alone,) = generate(program, [p], 12)
        assert b.tokens == alone.tokens
        assert b.logprobs == alone.logprobs  # bitwise: rows do not see each other


def test_seeded_sampling_is_reproducible_and_batch_invariant(case):
    c, _, program = case
    plist = prompts(c.vocab_size, [5, 14], seed=6)
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    batched = generate(program, plist, 10, sampling=sp)
    for p, b in zip(plist, batched):
        (alone,) = generate(program, [p], 10, sampling=sp)
        assert b.tokens == alone.tokens
