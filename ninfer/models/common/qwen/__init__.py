"""The Qwen frontend (layer 6): tokenizer, chat template, prompts and output semantics.

Shared by every Qwen architecture (Qwen3.5 dense/MoE, Qwen4-Exp). Entry point: `QwenFrontend`.
"""
from ninfer.models.common.qwen.deltas import FinalOutput, OutputDelta, ToolCall, ToolCallDelta
from ninfer.models.common.qwen.frontend import QwenFrontend
from ninfer.models.common.qwen.output_session import QwenOutputSession
from ninfer.models.common.qwen.prompt import PreparedPrompt, ToolChoice, ToolChoiceMode
from ninfer.models.common.qwen.reasoning import ReasoningStart
from ninfer.models.common.qwen.template import ChatTemplate, default_chat_template
from ninfer.models.common.qwen.tokenizer import QwenTokenizer, SpecialTokens

__all__ = [
    "ChatTemplate",
    "FinalOutput",
    "OutputDelta",
    "PreparedPrompt",
    "QwenFrontend",
    "QwenOutputSession",
    "QwenTokenizer",
    "ReasoningStart",
    "SpecialTokens",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolChoiceMode",
    "default_chat_template",
]
