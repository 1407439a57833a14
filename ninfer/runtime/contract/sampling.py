"""Per-request sampling parameters.

The sampler's numeric contract (shared by the CPU and CUDA samplers, see docs/ops.md):
1. penalties on the raw logits: repetition (HF rule, over prompt + output tokens: l/r if l > 0
   else l*r), then frequency and presence (OpenAI rule, over output tokens:
   l -= frequency*count + presence*(count > 0));
2. temperature == 0 -> greedy argmax (lowest id wins ties); else divide by temperature;
3. top_k (0 = off), then top_p (1.0 = off), then min_p (0.0 = off) filters;
4. draw with a counter-based generator: u = uniform(seed, n) where n is the index of the output
   token being drawn (0 for the first). The same seed gives the same tokens regardless of
   batching, pausing or replay, and on CPU and CUDA.
"""
from __future__ import annotations

import dataclasses
import math
import secrets

import numpy as np

from ninfer.errors import InvalidInput

INT32_MAX = 2**31 - 1


def _f32_positive(x: float) -> bool:
    """x survives the samplers' float32 conversion as a finite, strictly positive number."""
    with np.errstate(over="ignore", under="ignore"):
        return math.isfinite(x) and 0.0 < float(np.float32(x)) < math.inf


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    # How many top alternatives to report per token (0 = only the chosen token's logprob).
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        checks = [
            (math.isfinite(self.temperature) and self.temperature >= 0.0
             and (self.temperature == 0.0 or _f32_positive(self.temperature)),
             "temperature", "must be 0 (greedy) or a positive finite float32"),
            (self.top_p <= 1.0 and _f32_positive(self.top_p), "top_p",
             "must be in (0, 1] and representable in float32"),
            (0 <= self.top_k <= INT32_MAX, "top_k", "must be in [0, 2**31) (0 disables it)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (_f32_positive(self.repetition_penalty), "repetition_penalty",
             "must be a positive finite float32"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (0 <= self.top_logprobs <= 20, "top_logprobs", "must be in [0, 20]"),
            (self.seed is None or 0 <= self.seed < 2**64, "seed", "must be in [0, 2**64)"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise InvalidInput(f"{name} {why}, got {getattr(self, name)!r}", param=name)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_seed(self) -> "SamplingParams":
        """A copy whose seed is fixed (drawn at random when unset), so replay reproduces draws."""
        if self.seed is not None:
            return self
        return dataclasses.replace(self, seed=secrets.randbits(63))
