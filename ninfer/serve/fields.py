"""Declarative request fields: one table both validates a request body and documents it.

A `Field` states a top-level parameter's JSON type, range and description. `parse_fields`
checks a body against a table and returns ``name -> value`` for every field (None when absent
or null: an explicit null means "use the default", as in OpenAI's API). `object_schema` turns
the same table into the OpenAPI/JSON-schema object the server publishes at /openapi.json, so
the documentation cannot drift from what is enforced.

Nested values (messages, tools, tool_choice, prompts) are checked here only for their top-level
JSON type; their content is validated by the frontend, which names the exact nested field.
Parameters the server knows but does not support yet (`Unsupported`) are refused with a 400
naming them, unless their value is null or one of the values equivalent to omitting them.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Iterable, Mapping

from ninfer.serve.errors import ApiError

__all__ = ["Field", "Kind", "Unsupported", "as_int", "object_schema", "parse_fields", "token_ids"]


class Kind(enum.Enum):
    BOOL = "boolean"
    INT = "integer"
    NUMBER = "number"
    STRING = "string"
    OBJECT = "object"
    ARRAY = "array"
    ANY = "any"  # a union documented by `schema`, checked by the consumer


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    description: str
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False  # `minimum` itself is not allowed
    max_length: int | None = None  # strings: characters; arrays: items
    enum: tuple[Any, ...] | None = None
    schema: Mapping[str, Any] | None = None  # JSON schema of OBJECT/ARRAY/ANY values


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """A known parameter that is not supported yet; `neutral` values mean "not used"."""

    name: str
    reason: str
    neutral: tuple[Any, ...] = ()


_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object", type(None): "null"}


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _fail(field: Field, why: str, value: Any) -> ApiError:
    return ApiError(400, f"{field.name} {why}, got {_type_name(value)}"
                    + (f" {value!r}" if isinstance(value, (int, float)) else ""),
                    param=field.name, code="invalid_value")


def _range_text(field: Field) -> str:
    parts = []
    if field.minimum is not None:
        parts.append(f"{'>' if field.exclusive_minimum else '>='} {field.minimum:g}")
    if field.maximum is not None:
        parts.append(f"<= {field.maximum:g}")
    return " and ".join(parts)


def as_int(value: Any) -> int | None:
    """`value` as an int when it is a JSON integer (2.0 counts, as in JSON Schema), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def token_ids(value: Any) -> tuple[int, ...] | None:
    """A JSON array of integers as a tuple of ints, or None when it is not one."""
    if not isinstance(value, list):
        return None
    ids = tuple(as_int(v) for v in value)
    return None if any(i is None for i in ids) else ids


def _check_number(field: Field, value: Any) -> int | float:
    is_float = isinstance(value, float)
    if field.kind is Kind.INT:
        integer = as_int(value)
        if integer is None:
            raise _fail(field, "must be an integer", value)
        value = integer
    elif isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (is_float and not math.isfinite(value)):
        raise _fail(field, "must be a finite number", value)
    low, high = field.minimum, field.maximum
    too_low = low is not None and (value <= low if field.exclusive_minimum else value < low)
    if too_low or (high is not None and value > high):
        raise _fail(field, f"must be {_range_text(field)}", value)
    return value


def _check(field: Field, value: Any) -> Any:
    kind = field.kind
    if kind in (Kind.INT, Kind.NUMBER):
        value = _check_number(field, value)
    elif kind is Kind.BOOL and not isinstance(value, bool):
        raise _fail(field, "must be a boolean", value)
    elif kind is Kind.STRING and not isinstance(value, str):
        raise _fail(field, "must be a string", value)
    elif kind is Kind.OBJECT and not isinstance(value, dict):
        raise _fail(field, "must be an object", value)
    elif kind is Kind.ARRAY and not isinstance(value, list):
        raise _fail(field, "must be an array", value)
    if field.max_length is not None and isinstance(value, (str, list)) \
            and len(value) > field.max_length:
        raise ApiError(400, f"{field.name} may have at most {field.max_length} "
                       f"{'characters' if isinstance(value, str) else 'items'}",
                       param=field.name, code="invalid_value")
    if field.enum is not None and value not in field.enum:
        raise ApiError(400, f"{field.name} must be one of {', '.join(map(str, field.enum))}",
                       param=field.name, code="invalid_value")
    return value


def parse_fields(body: Mapping[str, Any], fields: Iterable[Field],
                 unsupported: Iterable[Unsupported] = ()) -> dict[str, Any]:
    """Validate `body` against `fields`; return name -> value (None when absent or null)."""
    table = {f.name: f for f in fields}
    refused = {u.name: u for u in unsupported}
    for key, value in body.items():
        if key in table:
            continue
        rule = refused.get(key)
        if rule is None:
            raise ApiError(400, f"unknown parameter {key!r}", param=key,
                           code="unknown_parameter")
        if value is not None and not any(value == n and type(value) is type(n)
                                         for n in rule.neutral):
            raise ApiError(400, f"parameter {key!r} is not supported: {rule.reason}",
                           param=key, code="unsupported_parameter")
    out: dict[str, Any] = {}
    for name, field in table.items():
        value = body.get(name)
        if value is None:
            if field.required:
                raise ApiError(400, f"{name} is required", param=name, code="missing_parameter")
            out[name] = None
        else:
            out[name] = _check(field, value)
    return out


def _field_schema(field: Field) -> dict[str, Any]:
    if field.schema is not None:
        base: dict[str, Any] = dict(field.schema)
    elif field.kind is Kind.ANY:
        base = {}
    else:
        base = {"type": field.kind.value}
    if field.minimum is not None:
        base["exclusiveMinimum" if field.exclusive_minimum else "minimum"] = field.minimum
    if field.maximum is not None:
        base["maximum"] = field.maximum
    if field.max_length is not None:
        base["maxLength" if field.kind is Kind.STRING else "maxItems"] = field.max_length
    if field.enum is not None:
        base["enum"] = list(field.enum)
    if not field.required:
        base = {"anyOf": [base, {"type": "null"}]}
    base["description"] = field.description
    return base


def object_schema(fields: Iterable[Field], description: str = "",
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON schema of a request body made of `fields` (unknown properties refused);
    `extra` adds object-level keywords (e.g. dependentSchemas for cross-field rules)."""
    fields = list(fields)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: _field_schema(f) for f in fields},
        "additionalProperties": False,
    }
    required = [f.name for f in fields if f.required]
    if required:
        schema["required"] = required
    if description:
        schema["description"] = description
    schema.update(extra or {})
    return schema
