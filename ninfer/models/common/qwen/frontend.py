"""QwenFrontend: one model's tokenizer, chat template and output semantics.

Built once per loaded model from the artifact's resources (tokenizer.json text, the chat
template, generation_config values) plus the vocabulary range of the model's embedding. The
frontend never infers behaviour from an architecture name: sampling defaults and EOS ids come
from `generation_defaults`, the id range from `vocab_size`.

Per request: `prepare_chat` / `prepare_completion` build an owning `PreparedPrompt` (on the
submitting thread), `new_session` the request's `QwenOutputSession` (engine worker thread).
"""
from __future__ import annotations

import secrets
import types
from typing import Any, Mapping, Sequence

from ninfer.errors import ArtifactError, InvalidInput
from ninfer.models.common.qwen.detokenize import IncrementalDetokenizer
from ninfer.models.common.qwen.output_session import QwenOutputSession
from ninfer.models.common.qwen.prompt import PreparedPrompt, ToolChoiceMode
from ninfer.models.common.qwen.reasoning import THINK, THINK_END, ReasoningStart
from ninfer.models.common.qwen.stop import stop_token_set, validate_stop_strings
from ninfer.models.common.qwen.template import (
    ChatTemplate, check_template_kwargs, default_chat_template,
)
from ninfer.models.common.qwen.tokenizer import QwenTokenizer
from ninfer.models.common.qwen.tools import normalize_tool_choice, normalize_tools, tool_prefix
from ninfer.runtime.contract.sampling import SamplingParams

__all__ = ["QwenFrontend"]

IM_START = "<|im_start|>"
# generation_config keys that are sampling defaults (same names as SamplingParams fields)
_SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty",
)


def _reasoning_start(prompt_text: str) -> ReasoningStart:
    """Where the output starts, from the last turn of the rendered prompt."""
    turn = prompt_text[prompt_text.rfind(IM_START) + 1:] if IM_START in prompt_text else prompt_text
    opened, closed = turn.rfind(THINK), turn.rfind(THINK_END)
    if opened > closed:
        return ReasoningStart.OPEN
    if closed >= 0:  # a closed (empty) block: thinking is off, everything is content
        return ReasoningStart.OFF
    return ReasoningStart.DETECT


def _sampling_defaults(config: Mapping[str, Any]) -> Mapping[str, float | int]:
    out: dict[str, float | int] = {}
    for key in _SAMPLING_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = int(value) if key == "top_k" else float(value)
    if config.get("do_sample") is False:  # HF: greedy unless do_sample
        out["temperature"] = 0.0
    try:
        SamplingParams(**out)
    except InvalidInput as exc:
        raise ArtifactError(f"generation defaults are invalid: {exc}") from exc
    return types.MappingProxyType(out)


def _eos_ids(config: Mapping[str, Any], tokenizer: QwenTokenizer) -> tuple[int, ...]:
    raw = config.get("eos_token_id")
    if raw is None:  # no generation_config: end at the chat turn / document end
        return (tokenizer.special.im_end, tokenizer.special.endoftext)
    ids = [raw] if isinstance(raw, int) else raw
    if not isinstance(ids, (list, tuple)) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise ArtifactError(f"generation defaults: bad eos_token_id {raw!r}")
    return tuple(ids)


class QwenFrontend:
    """Read-only after construction; prepare_* may run on any thread."""

    def __init__(
        self,
        tokenizer: QwenTokenizer,
        template: ChatTemplate | None,
        generation_defaults: Mapping[str, Any],
        vocab_size: int,
    ):
        if vocab_size <= 0:
            raise ArtifactError(f"vocab_size must be positive, got {vocab_size}")
        self.tokenizer = tokenizer
        self.template = template
        self.vocab_size = vocab_size
        self.eos_token_ids = _eos_ids(generation_defaults, tokenizer)
        self.sampling_defaults = _sampling_defaults(generation_defaults)
        special = tokenizer.special
        # markers the output parsers read stay in the text even with skip_special_tokens
        markers = {special.think, special.think_end, special.tool_call, special.tool_call_end}
        self._skippable = tokenizer.special_token_ids - markers

    @classmethod
    def from_resources(
        cls,
        tokenizer_json: str,
        chat_template: str | None,
        generation_defaults: Mapping[str, Any],
        vocab_size: int,
    ) -> "QwenFrontend":
        """Build from artifact resources. `chat_template` None -> the packaged Qwen3.5
        template; a launch flag's override is just another source string."""
        source = chat_template if chat_template is not None else default_chat_template()
        return cls(QwenTokenizer(tokenizer_json), ChatTemplate(source), generation_defaults,
                   vocab_size)

    # --- prompts ----------------------------------------------------------------------------
    def prepare_chat(
        self,
        messages: Any,
        *,
        tools: Any = None,
        tool_choice: Any = "auto",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> PreparedPrompt:
        if self.template is None:
            raise InvalidInput("this model has no chat template", param="messages")
        tool_list, schemas = normalize_tools(tools)
        choice = normalize_tool_choice(tool_choice, frozenset(schemas))
        kwargs = check_template_kwargs(chat_template_kwargs)
        text = self.template.render(
            messages, tools=tool_list or None, add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        reasoning = _reasoning_start(text)
        prefix = tool_prefix(choice)
        if prefix:
            if not add_generation_prompt:
                raise InvalidInput(
                    "tool_choice 'required' or a named function needs add_generation_prompt",
                    param="tool_choice",
                )
            if reasoning is ReasoningStart.OPEN:
                # close the thinking block first: the model's own non-thinking format
                prefix = "\n" + THINK_END + "\n\n" + prefix
        text += prefix
        ids = self._check_range(self.tokenizer.encode(text), "messages")
        return PreparedPrompt(
            token_ids=tuple(ids), prompt_text=text, reasoning=reasoning, tools=schemas,
            tool_choice=choice, forced_prefix=prefix,
        )

    def prepare_completion(self, prompt: str | Sequence[int]) -> PreparedPrompt:
        """A raw prompt (text or token ids); the output is plain content."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInput("the prompt is empty", param="prompt")
            ids = self._check_range(self.tokenizer.encode(prompt), "prompt")
            return PreparedPrompt(token_ids=tuple(ids), prompt_text=prompt)
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise InvalidInput("prompt must be a string or a non-empty list of token ids",
                               param="prompt")
        for i, tid in enumerate(prompt):
            if isinstance(tid, bool) or not isinstance(tid, int):
                raise InvalidInput(f"prompt[{i}] must be an integer token id", param="prompt")
        return PreparedPrompt(token_ids=tuple(self._check_range(prompt, "prompt")))

    def _check_range(self, ids: Sequence[int], param: str) -> Sequence[int]:
        for tid in ids:
            if not 0 <= tid < self.vocab_size:
                raise InvalidInput(
                    f"token id {tid} is outside the model's vocabulary [0, {self.vocab_size})",
                    param=param,
                )
        return ids

    # --- output -----------------------------------------------------------------------------
    def new_session(
        self,
        prepared: PreparedPrompt,
        *,
        stop: str | Sequence[str] | None = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        skip_special_tokens: bool = True,
        call_id_prefix: str | None = None,
    ) -> QwenOutputSession:
        """The request's output session. `skip_special_tokens` drops the text of special
        tokens except the markers the parsers read (<think>, </think>, <tool_call>,
        </tool_call>); stop token ids never produce text."""
        stops = validate_stop_strings(stop)
        stop_ids = stop_token_set(
            self.eos_token_ids, stop_token_ids or (), ignore_eos=ignore_eos,
            vocab_size=self.vocab_size,
        )
        skip = self._skippable if skip_special_tokens else frozenset()
        parse_tools = bool(prepared.tools) and prepared.tool_choice.mode is not ToolChoiceMode.NONE
        return QwenOutputSession(
            IncrementalDetokenizer(self.tokenizer.token_bytes, skip),
            stop_strings=stops,
            stop_token_ids=stop_ids,
            reasoning=prepared.reasoning,
            tools=prepared.tools if parse_tools else None,
            forced_prefix=prepared.forced_prefix,
            call_id_prefix=call_id_prefix if call_id_prefix is not None else secrets.token_hex(8),
        )
