"""Typing of tool-call parameter values by the tool's JSON schema.

The Qwen3.5 XML format writes every parameter value as text: strings raw, everything else as
JSON. `ParamType` says how a parameter's text becomes a JSON value:

- schema type exactly ``string`` (or a string ``enum``): the text itself, streamable as it
  arrives;
- any other declared type(s): parsed as JSON and kept when it matches a declared type (an
  integral float for ``integer`` becomes an int; Python-style ``True``/``False``/``None`` are
  accepted for ``boolean``/``null``); otherwise the raw text as a string;
- a parameter the schema does not declare: a string (the model was told of no other type);
- a declared parameter without type information: JSON when it parses, else the string.

Text that parses as a JSON string (``"x"``) stays the raw text, quotes included: the format
writes strings raw, so quotes are the model's own characters.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

__all__ = ["ParamType", "param_type", "convert_value"]

_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "object", "array", "null"})
_PY_LITERALS = {"True": True, "False": False, "None": None}


@dataclasses.dataclass(frozen=True, slots=True)
class ParamType:
    types: frozenset[str]  # declared JSON types; empty = unknown (any JSON, else string)

    @property
    def is_string(self) -> bool:
        return self.types == frozenset({"string"})


STRING = ParamType(frozenset({"string"}))
ANY = ParamType(frozenset())


def _schema_types(schema: Any) -> set[str]:
    if not isinstance(schema, Mapping):
        return set()
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared} & _JSON_TYPES
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)} & _JSON_TYPES
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return {_json_type(v) for v in schema["enum"]}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            found: set[str] = set()
            for sub in schema[key]:
                sub_types = _schema_types(sub)
                if not sub_types:
                    return set()  # one untyped branch makes the whole union untyped
                found |= sub_types
            return found
    return set()


def param_type(parameters_schema: Mapping[str, Any] | None, name: str) -> ParamType:
    """Type of parameter `name` under a tool's `parameters` JSON schema."""
    props = parameters_schema.get("properties") if isinstance(parameters_schema, Mapping) else None
    if not isinstance(props, Mapping) or name not in props:
        return STRING
    types = _schema_types(props[name])
    return ParamType(frozenset(types)) if types else ANY


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_json(text: str) -> tuple[bool, Any]:
    stripped = text.strip()
    if stripped in _PY_LITERALS:
        return True, _PY_LITERALS[stripped]
    try:
        value = json.loads(stripped, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False, None
    if isinstance(value, float) and not math.isfinite(value):  # 1e999 overflows to inf
        return False, None
    return True, value


def convert_value(text: str, ptype: ParamType) -> Any:
    """JSON value of a parameter's complete text (already stripped of its edge newlines)."""
    if ptype.is_string:
        return text
    ok, value = _parse_json(text)
    if not ok or isinstance(value, str):  # strings are written raw, never JSON-quoted
        return text
    if not ptype.types:
        return value
    kind = _json_type(value)
    if kind in ptype.types or (kind == "integer" and "number" in ptype.types):
        return value
    if kind == "number" and "integer" in ptype.types and value.is_integer():
        return int(value)
    return text
