"""What `ninfer serve` loads: an artifact (or the demo model) on a device, as a `LoadedModel`.

`make_loader(options)` returns the function `ModelHost` runs on its background thread. Device
``auto`` tries CUDA first when a CUDA device is usable and falls back to the CPU when the model
has no CUDA backend yet (the loader refuses the device with `InvalidInput(param="device")`).
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

from ninfer.errors import InvalidInput
from ninfer.serve.lifecycle import LoadedModel

__all__ = ["LoadOptions", "cuda_usable", "device_candidates", "make_loader"]

_log = logging.getLogger("ninfer.serve")
DEVICES = ("auto", "cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    artifact: str | None  # None: the demo model
    device: str = "auto"
    max_concurrency: int = 4
    max_context_len: int | None = None
    chat_template: str | None = None  # template source overriding the artifact's
    verify: bool = True
    scripted_program: str | None = None  # test double: scripted tokens over a FakeProgram


def cuda_usable() -> bool:
    try:
        from ninfer.core.cuda import read_properties

        read_properties(0)
        return True
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no"
        return False


def device_candidates(device: str) -> tuple[str, ...]:
    if device not in DEVICES:
        raise InvalidInput(f"device must be one of {', '.join(DEVICES)}", param="device")
    if device == "auto":
        return ("cuda", "cpu") if cuda_usable() else ("cpu",)
    return (device,)


def _artifact_path(options: LoadOptions) -> Path:
    if options.artifact is not None:
        return Path(options.artifact)
    from tools.demo import demo_artifact_path

    return demo_artifact_path(progress=False)


def _load_instance(path: Path, options: LoadOptions):
    from ninfer.models.registry import ProgramOptions, load_model_instance

    candidates = device_candidates(options.device)
    for i, device in enumerate(candidates):
        program_options = ProgramOptions(device=device, max_concurrency=options.max_concurrency,
                                         max_context_len=options.max_context_len)
        try:
            return load_model_instance(path, program_options, verify=options.verify,
                                       chat_template=options.chat_template)
        except InvalidInput as exc:
            if exc.param != "device" or i + 1 == len(candidates):
                raise
            _log.warning("device %s: %s; trying %s", device, exc, candidates[i + 1])
    raise AssertionError("unreachable")


def make_loader(options: LoadOptions) -> Callable[[], LoadedModel]:
    def load() -> LoadedModel:
        instance = _load_instance(_artifact_path(options), options)
        try:
            if instance.frontend is None:
                raise InvalidInput("the artifact has no tokenizer.json; the server needs one",
                                   param="artifact")
            program = instance.program
            if options.scripted_program is not None:  # test double: see serve/scripted.py
                from ninfer.serve.scripted import scripted_fake_program

                program = scripted_fake_program(program.limits, options.scripted_program,
                                                instance.frontend.tokenizer.decode)
        except BaseException:
            instance.close()
            raise
        return LoadedModel(name=instance.name, program=program, frontend=instance.frontend,
                           description=instance.plan.describe(), close=instance.close)

    return load
