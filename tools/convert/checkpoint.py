"""An HF checkpoint directory: config, frontend files and the safetensors tensor index."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ninfer.errors import ConversionError
from tools.convert.safetensors import SafetensorsFile, TensorInfo

INDEX_NAME = "model.safetensors.index.json"


class ConversionWarning(UserWarning):
    """Something in the checkpoint was skipped (unused tensors, no tokenizer)."""


class HFCheckpoint:
    """Open `hf_dir`: parse config.json and every safetensors header (data is memory-mapped).

    Raises `ConversionError` for a missing directory/config/shard, invalid JSON, a truncated
    safetensors file or a tensor stored twice."""

    def __init__(self, hf_dir: str | os.PathLike):
        self.dir = Path(hf_dir)
        if not self.dir.is_dir():
            raise ConversionError(f"checkpoint directory {self.dir} does not exist")
        config = self.read_json("config.json")
        if config is None:
            raise ConversionError(f"missing config.json in {self.dir}")
        self.config: dict = config
        self._files: list[SafetensorsFile] = []
        self._where: dict[str, SafetensorsFile] = {}
        try:
            self._open_tensors()
        except BaseException:
            self.close()
            raise

    def _open_tensors(self) -> None:
        index = self.read_json(INDEX_NAME)
        if index is not None:
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict):
                raise ConversionError(f"{self.dir / INDEX_NAME} has no 'weight_map' object")
            names = sorted(set(weight_map.values()))
            for name in names:
                if not (self.dir / name).is_file():
                    raise ConversionError(f"missing safetensors shard {name} (listed in "
                                          f"{INDEX_NAME}) in {self.dir}")
        else:
            names = sorted(p.name for p in self.dir.glob("*.safetensors"))
            if not names:
                raise ConversionError(f"no *.safetensors files in {self.dir}")
        for name in names:
            st = SafetensorsFile(self.dir / name)
            self._files.append(st)
            for key in st.tensors:
                if key in self._where:
                    raise ConversionError(f"tensor {key!r} is stored twice ({self._where[key].path.name} "
                                          f"and {name})")
                self._where[key] = st
        if index is not None:
            for key, name in index["weight_map"].items():
                if self._where.get(key) is None or self._where[key].path.name != name:
                    raise ConversionError(f"{INDEX_NAME} maps {key!r} to {name}, which does not "
                                          f"contain it")

    # -- tensors -------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def info(self, key: str) -> TensorInfo:
        return self._where[key].tensors[key]

    def array(self, key: str) -> np.ndarray:
        return self._where[key].array(key)

    def release(self, key: str) -> None:
        self._where[key].release(key)

    def close(self) -> None:
        for st in self._files:
            st.close()
        self._files.clear()

    def __enter__(self) -> "HFCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- side files ----------------------------------------------------------------------------
    def read_bytes(self, name: str) -> bytes | None:
        path = self.dir / name
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConversionError(f"cannot read {path}: {exc.strerror}") from None

    def read_json(self, name: str) -> dict | None:
        raw = self.read_bytes(name)
        if raw is None:
            return None
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConversionError(f"{self.dir / name} is not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise ConversionError(f"{self.dir / name} must hold a JSON object")
        return value
