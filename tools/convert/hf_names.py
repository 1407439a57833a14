"""How logical parameter names (ninfer.models.qwen3_5.weights) map to HF checkpoint keys.

- text `X`         -> `model.language_model.X` (ConditionalGeneration layout) or `model.X`
                      (CausalLM layout); `lm_head.weight` keeps its name
- MTP `mtp.X`      -> `mtp.X`
- vision `visual.X` -> `model.visual.X`
- routed experts may also be stored per expert: `...mlp.experts.gate_up_proj` [E, 2Im, H] is
  `...mlp.experts.{e}.gate_proj.weight` and `up_proj.weight` ([Im, H] each, gate first) for
  e = 0..E-1, and `...mlp.experts.down_proj` [E, H, Im] is `...mlp.experts.{e}.down_proj.weight`.
"""
from __future__ import annotations

CONDITIONAL_TEXT_PREFIX = "model.language_model."
CAUSAL_TEXT_PREFIX = "model."
FUSED_GATE_UP = "mlp.experts.gate_up_proj"
FUSED_DOWN = "mlp.experts.down_proj"


def hf_key(logical: str, *, text_prefix: str) -> str:
    """The HF checkpoint key of a logical parameter, for the given text prefix."""
    if logical == "lm_head.weight" or logical.startswith("mtp."):
        return logical
    if logical.startswith("visual."):
        return "model." + logical
    return text_prefix + logical


def per_expert_keys(fused_key: str, num_experts: int) -> list[str] | None:
    """Per-expert HF keys whose concatenation (in order) equals a fused expert tensor, or None
    if `fused_key` is not a fused expert tensor."""
    if fused_key.endswith(FUSED_GATE_UP):
        base = fused_key[: -len("gate_up_proj")]
        return [f"{base}{e}.{p}_proj.weight" for e in range(num_experts) for p in ("gate", "up")]
    if fused_key.endswith(FUSED_DOWN):
        base = fused_key[: -len("down_proj")]
        return [f"{base}{e}.down_proj.weight" for e in range(num_experts)]
    return None
