"""ScriptedProgram: a test double at the Program boundary (``ninfer serve --scripted-program``).

It wraps a Program and replaces the tokens its decode rows produce with a script chosen per
request, so end-to-end tests can drive the real frontend (tool-call and reasoning parsing),
engine, streaming and response code with an exact token sequence from the real tokenizer. The
wrapped Program still runs every step, so resources, batching and metrics behave as usual; a
Program that commits the row's tokens (the Qwen3.5 Program does) is fed the scripted ones.

`scripted_fake_program` is what ``--scripted-program`` serves: the script over a FakeProgram
with the real model's limits (vocabulary, context, pages, slots), so the scripted server runs
in milliseconds per token while the model's tokenizer, template and frontend stay real.

Script file (JSON)::

    {"scripts": [{"trigger": "TEXT", "tokens": [id, ...]}, ...], "default": [id, ...] | null}

A request whose decoded prompt contains a script's trigger gets that script (the first match);
other requests get `default` (null: the model's own tokens). Output token i is script[i]; past
the end of its script a request gets the model's own tokens. Logprobs stay the model's (of the
token it would have produced).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Sequence

from ninfer.errors import InvalidInput

__all__ = ["Script", "ScriptedProgram", "load_scripts", "scripted_fake_program"]


@dataclasses.dataclass(frozen=True)
class Script:
    trigger: str
    tokens: tuple[int, ...]


def _ids(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw):
        raise InvalidInput(f"{where} must be a list of token ids", param="scripted_program")
    return tuple(raw)


def load_scripts(path: str | Path) -> tuple[list[Script], tuple[int, ...] | None]:
    """Read a script file; returns (scripts, default tokens or None)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"cannot read the script file {path}: {exc}",
                           param="scripted_program") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("scripts", []), list):
        raise InvalidInput("a script file is {\"scripts\": [...], \"default\": ...}",
                           param="scripted_program")
    scripts = []
    for i, item in enumerate(doc.get("scripts", [])):
        if not isinstance(item, dict) or not isinstance(item.get("trigger"), str) \
                or not item["trigger"]:
            raise InvalidInput(f"scripts[{i}] needs a non-empty 'trigger' string",
                               param="scripted_program")
        scripts.append(Script(item["trigger"], _ids(item.get("tokens"), f"scripts[{i}].tokens")))
    default = doc.get("default")
    return scripts, None if default is None else _ids(default, "default")


class ScriptedProgram:
    """Forwards the Program contract to `inner`, rewriting decode rows (see module doc)."""

    def __init__(self, inner, scripts: Sequence[Script], default: tuple[int, ...] | None,
                 decode: Callable[[Sequence[int]], str]):
        vocab = inner.limits.vocab_size
        for tokens in [s.tokens for s in scripts] + [default or ()]:
            if any(t >= vocab for t in tokens):
                raise InvalidInput(f"a scripted token id is outside the vocabulary [0, {vocab})",
                                   param="scripted_program")
        self._inner = inner
        self._scripts = tuple(scripts)
        self._default = default
        self._decode = decode
        self._live: dict[int, tuple[tuple[int, ...], int]] = {}  # seq -> (script, prompt len)
        self._paused: dict[int, tuple[tuple[int, ...], int]] = {}  # id(ResumeState) -> same

    def __getattr__(self, name: str):  # limits, capacity, pending_prefill, ...
        return getattr(self._inner, name)

    def _choose(self, prompt_ids: Sequence[int]) -> tuple[int, ...] | None:
        text = self._decode(list(prompt_ids))
        for script in self._scripts:
            if script.trigger in text:
                return script.tokens
        return self._default

    def open_sequence(self, prompt_ids, sampling):
        seq = self._inner.open_sequence(prompt_ids, sampling)
        script = self._choose(prompt_ids)
        if script is not None:
            self._live[seq] = (script, len(prompt_ids))
        return seq

    def run(self, plan):
        batch = self._inner.run(plan)
        rows = []
        for row in batch.rows:
            entry = None if row.is_prefill else self._live.get(row.seq)
            if entry is not None:
                script, prompt_len = entry
                index = self._inner.ledger_len(row.seq) - prompt_len
                if index < len(script):
                    row = dataclasses.replace(row, token_ids=(script[index],))
            rows.append(row)
        batch.rows = tuple(rows)  # the inner Program commits what the batch now holds
        return batch

    def release(self, seq) -> None:
        self._inner.release(seq)
        self._live.pop(seq, None)

    def pause(self, seq, prefer):
        state = self._inner.pause(seq, prefer)
        entry = self._live.pop(seq, None)
        if entry is not None:
            self._paused[id(state)] = entry
        return state

    def revoke_snapshot(self, state):
        new = self._inner.revoke_snapshot(state)
        entry = self._paused.pop(id(state), None)
        if entry is not None:
            self._paused[id(new)] = entry
        return new

    def resume(self, state):
        seq = self._inner.resume(state)
        if seq is not None:
            entry = self._paused.pop(id(state), None)
            if entry is not None:
                self._live[seq] = entry
        return seq

    def discard_resume_state(self, state) -> None:
        self._inner.discard_resume_state(state)
        self._paused.pop(id(state), None)


def scripted_fake_program(limits, script_path: str | Path,
                          decode: Callable[[Sequence[int]], str]) -> ScriptedProgram:
    """The scripts of `script_path` over a FakeProgram shaped like `limits` (ProgramLimits)."""
    from ninfer.testing.fake_program import FakeProgram

    scripts, default = load_scripts(script_path)
    fake = FakeProgram(vocab_size=limits.vocab_size, max_context_len=limits.max_context_len,
                       page_size=limits.page_size, total_pages=limits.total_pages,
                       total_slots=limits.total_slots, max_batch=limits.max_batch,
                       prefill_chunk=limits.prefill_chunk)
    return ScriptedProgram(fake, scripts, default, decode)
