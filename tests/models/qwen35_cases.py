"""Shared fixtures of the Qwen3.5 model tests: random HF checkpoints, their artifacts, HF models,
and a minimal driver of the Program contract (no engine)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ninfer.models.qwen3_5.startup import ProgramOptions
from ninfer.models.registry import load_model_instance
from ninfer.runtime.contract import PrefillChunk, RowDecision, SamplingParams, StepPlan
from ninfer.testing.checkpoints import PRESETS, write_hf_checkpoint
from tools.convert import convert_checkpoint

ARCH = {
    "tiny-dense": "Qwen3_5ForCausalLM",
    "tiny-dense-tied": "Qwen3_5ForCausalLM",
    "tiny-moe": "Qwen3_5MoeForCausalLM",
    "tiny-moe-tied": "Qwen3_5MoeForCausalLM",
}


@dataclasses.dataclass
class Case:
    name: str
    hf_dir: Path
    artifact: Path
    vocab_size: int


def build_case(root: Path, name: str, *, dtype: str = "float32", seed: int = 7,
               convert_dtype: str = "keep", overrides: dict | None = None) -> Case:
    """A preset checkpoint (`overrides` replaces config entries) and its converted artifact."""
    config = dict(PRESETS[name], **(overrides or {}))
    hf_dir = root / f"{name}-{dtype}"
    write_hf_checkpoint(hf_dir, config, seed=seed, dtype=dtype, architecture=ARCH[name])
    art = convert_checkpoint(hf_dir, root / f"{name}-{dtype}-{convert_dtype}.ninfer",
                             dtype=convert_dtype, progress=False)
    return Case(name, hf_dir, art, config["vocab_size"])


def load_hf(case: Case, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = dict(dtype=getattr(torch, dtype), attn_implementation="eager")
    try:
        model = AutoModelForCausalLM.from_pretrained(case.hf_dir, experts_implementation="eager",
                                                     **kwargs)
    except (TypeError, ValueError):
        model = AutoModelForCausalLM.from_pretrained(case.hf_dir, **kwargs)
    return model.eval()


def open_program(case: Case, **opts):
    base = dict(max_concurrency=4, prefill_chunk=16, max_context_len=512, page_size=8)
    base.update(opts)
    return load_model_instance(case.artifact, ProgramOptions(**base)).program


def prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, min(vocab, 500), n).tolist() for n in lengths]


@dataclasses.dataclass
class Generation:
    tokens: list[int]
    logprobs: list[float]
    logits: list[np.ndarray]  # decode logits of every step (copies)


def generate(program, prompt_list, max_new: int, sampling: SamplingParams | None = None,
             keep_logits: bool = False) -> list[Generation]:
    """Drive the Program directly: one prefill chunk (rotating) + all decode-ready rows a step."""
    sampling = sampling or SamplingParams(temperature=0.0, seed=0)
    seqs = [program.open_sequence(p, sampling) for p in prompt_list]
    gens = {s: Generation([], [], []) for s in seqs}
    live = list(seqs)
    turn = 0
    while live:
        for s in live:
            assert program.reserve_units(s, program.next_unit_tokens(s)), "test budget too small"
        prefilling = [s for s in live if program.pending_prefill(s)]
        decode = tuple(s for s in live if not program.pending_prefill(s))
        chunk = PrefillChunk(prefilling[turn % len(prefilling)]) if prefilling else None
        turn += 1
        batch = program.run(StepPlan(decode=decode, prefill=chunk))
        if keep_logits and decode:
            logits = program.backend.last_logits(len(decode))
        decisions = []
        for row in batch.rows:
            if row.is_prefill:
                decisions.append(RowDecision(0))
                continue
            g = gens[row.seq]
            g.tokens.append(row.token_ids[0])
            g.logprobs.append(row.logprobs[0])
            if keep_logits:
                g.logits.append(logits[decode.index(row.seq)])
            decisions.append(RowDecision(1))
        program.commit(batch, decisions)
        for s in list(live):
            if len(gens[s].tokens) == max_new:
                program.release(s)
                live.remove(s)
    return [gens[s] for s in seqs]


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert np.isfinite(out).all(), "non-finite values"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
