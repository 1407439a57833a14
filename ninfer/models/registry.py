"""Architecture name -> model start-up, resolved once at the edge (style rule 15).

`load_model_instance(path, options)` opens a `.ninfer` artifact, starts the architecture's
Program and builds the Qwen frontend from the artifact's resources. The frontend receives the
model's facts (vocab size, generation defaults) as data; it never looks at the architecture name.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ninfer.artifact import Artifact
from ninfer.errors import ArtifactError, InvalidInput
from ninfer.models.qwen3_5.startup import CapacityPlan, ProgramOptions, start_qwen35

_STARTERS = {
    "Qwen3_5ForCausalLM": start_qwen35,
    "Qwen3_5ForConditionalGeneration": start_qwen35,
    "Qwen3_5MoeForCausalLM": start_qwen35,
    "Qwen3_5MoeForConditionalGeneration": start_qwen35,
}


@dataclasses.dataclass
class ModelInstance:
    name: str
    architecture: str
    program: object  # the runtime Program
    frontend: object | None  # QwenFrontend, None when the artifact has no tokenizer
    plan: CapacityPlan
    generation_defaults: dict
    artifact: Artifact
    loaded: object  # the architecture's LoadedModel (config, parameters)

    def close(self) -> None:
        self.artifact.close()


def _resource_text(artifact: Artifact, name: str) -> str | None:
    return artifact.resource(name).decode("utf-8") if name in artifact.resources else None


def generation_defaults(artifact: Artifact) -> dict:
    raw = _resource_text(artifact, "generation_config.json")
    return json.loads(raw) if raw else {}


def load_model_instance(path: str | Path, options: ProgramOptions | None = None, *,
                        verify: bool = True, chat_template: str | None = None,
                        progress: bool = False) -> ModelInstance:
    options = options or ProgramOptions()
    artifact = Artifact.open(path, verify=verify, progress=progress)
    try:
        starter = _STARTERS.get(artifact.architecture)
        if starter is None:
            raise ArtifactError(
                f"{path}: architecture {artifact.architecture!r} is not supported "
                f"(supported: {', '.join(sorted(_STARTERS))})")
        loaded = starter(artifact, options)
        defaults = generation_defaults(artifact)
        frontend = None
        tokenizer_json = _resource_text(artifact, "tokenizer.json")
        if tokenizer_json is not None:
            from ninfer.models.common.qwen.frontend import QwenFrontend

            template = chat_template or _resource_text(artifact, "chat_template.jinja")
            frontend = QwenFrontend.from_resources(
                tokenizer_json, template, defaults, loaded.config.vocab_size)
        return ModelInstance(
            name=artifact.name, architecture=artifact.architecture, program=loaded.program,
            frontend=frontend, plan=loaded.plan, generation_defaults=defaults,
            artifact=artifact, loaded=loaded)
    except BaseException:
        artifact.close()
        raise


def eos_token_ids(defaults: dict) -> tuple[int, ...]:
    raw = defaults.get("eos_token_id")
    if raw is None:
        return ()
    return tuple(raw) if isinstance(raw, list) else (int(raw),)


__all__ = ["InvalidInput", "ModelInstance", "ProgramOptions", "eos_token_ids",
           "generation_defaults", "load_model_instance"]
