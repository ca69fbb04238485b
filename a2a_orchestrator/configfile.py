"""Operator files checked against pydantic schemas, with one error wording.

A problem in an operator's file (a role, an agent, the callers file, a
hook, spawn policy or reactions file, the price table) is one `ConfigError`
worded one way:

    FILE: field 'KEY.PATH': must be WHAT, got VALUE

`FILE` names the file, and the entry in it where the file holds a list of
them (`.a2a/hooks.toml: hook 2`); `KEY.PATH` is the key inside it, dotted
(`callers.ops.token_hash`); the rest says what a good value is and what the
file has instead (a missing key: `missing`, and what it is for).

A schema is a pydantic model over the parsed file, validated once, when the
file is read. The field types below carry the wording (`must_be`), so a
field's problem reads the same in every file. Only the modules that read an
operator's file import this one (and with it pydantic, which a2a-sdk's
servers and clients import anyway): the commands that read none, `--help`
and `status` among them, never pay for it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from .errors import ConfigError

__all__ = [
    "Count",
    "Flag",
    "NameList",
    "OperatorFile",
    "Port",
    "PositiveInt",
    "PositiveNumber",
    "SecondsOrZero",
    "Text",
    "check",
    "describe",
    "must_be",
]

_Schema = TypeVar("_Schema", bound=BaseModel)


class OperatorFile(BaseModel):
    """The base of every schema here: frozen, strict (a `true` is not a
    `1`, a `"3"` is not a 3) and refusing keys it does not know. A required
    field's `Field(description=...)` says what it is for when it is missing
    (not a docstring: reading those costs a parse of the module's source)."""

    # Each schema's validator is built when it first checks a file: a
    # process that never reads a hook file never builds the hook schema.
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", defer_build=True)


def must_be(what: str) -> WrapValidator:
    """Word any failure of the annotated type as `must be WHAT`."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("config", "must be {what}", {"what": what}) from None

    return WrapValidator(validate)


_Stripped = Annotated[StrictStr, StringConstraints(strip_whitespace=True, min_length=1)]

Text = Annotated[_Stripped, must_be("a non-empty string")]
"""A string with something in it besides whitespace, taken stripped."""
Flag = Annotated[StrictBool, must_be("true or false")]
PositiveInt = Annotated[StrictInt, Field(gt=0), must_be("a positive integer")]
Count = Annotated[StrictInt, Field(ge=0), must_be("a whole number, 0 or more")]
PositiveNumber = Annotated[float, Field(gt=0, allow_inf_nan=False), must_be("a positive number")]
SecondsOrZero = Annotated[
    float,
    Field(ge=0, allow_inf_nan=False),
    must_be("a number of seconds, 0 for no limit"),
]
Port = Annotated[StrictInt, Field(ge=1, le=65535), must_be("an integer from 1 to 65535")]
NameList = Annotated[list[_Stripped], must_be("a list of non-empty strings")]


def check(schema: type[_Schema], data: object, where: str) -> _Schema:
    """`data` validated against `schema`; a `ConfigError` worded as the
    module docstring says, naming `where` (the file, and its entry), for the
    first problem."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        field, problem = describe(exc, schema)
        raise ConfigError(f"{where}: field {field!r}: {problem}") from exc


def describe(exc: ValidationError, schema: type[BaseModel]) -> tuple[str, str]:
    """The key path and the problem of `exc`'s first error, in this module's
    words (a reader such as the role files' wraps them in its own error)."""
    error = exc.errors(include_url=False)[0]
    return _key_path(error["loc"]), _problem(error, schema)


def _key_path(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


_PROBLEMS: dict[str, Callable[[dict[str, Any]], str]] = {
    "missing": lambda ctx: "missing",
    "invalid_key": lambda ctx: "must be a string to name a field",
    "string_type": lambda ctx: "must be a string",
    "string_too_short": lambda ctx: "must be a non-empty string",
    "bool_type": lambda ctx: "must be true or false",
    "int_type": lambda ctx: "must be a whole number",
    "float_type": lambda ctx: "must be a number",
    "list_type": lambda ctx: "must be a list",
    "dict_type": lambda ctx: "must be a table of fields",
    "model_type": lambda ctx: "must be a table of fields",
    "literal_error": lambda ctx: f"must be one of {ctx['expected']}",
    "greater_than": lambda ctx: f"must be more than {ctx['gt']}",
    "greater_than_equal": lambda ctx: f"must be {ctx['ge']} or more",
    "less_than_equal": lambda ctx: f"must be {ctx['le']} or less",
}


def _problem(error: ErrorDetails, schema: type[BaseModel]) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    loc = error["loc"]
    if kind == "extra_forbidden":
        # The known fields are listed where the table's schema is known.
        table = _schema_at(schema, loc[:-1])
        if table is None:
            return "unknown field"
        return f"unknown field; known fields are {', '.join(sorted(table.model_fields))}"
    if kind == "config":  # a `must_be` type's own wording
        problem = error["msg"]
    elif kind in _PROBLEMS:
        problem = _PROBLEMS[kind](ctx)
    else:  # pydantic's own words, for a kind no schema here has met yet
        problem = error["msg"][:1].lower() + error["msg"][1:]
    if kind == "missing":
        # A required field's description says what it is for.
        table = _schema_at(schema, loc[:-1])
        field = table.model_fields.get(str(loc[-1])) if table is not None else None
        if field is None or not field.description:
            return problem
        what = " ".join(field.description.split()).rstrip(".")
        return f"{problem}; {what[:1].lower()}{what[1:]}"
    return f"{problem}, got {_shown(error['input'])}"


def _schema_at(schema: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The schema of the table at `loc` (through nested schemas, and the
    values of `dict[str, Schema]` and `list[Schema]` fields), if it is one."""
    kind: Any = schema
    for part in loc:
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(str(part))
            if field is None:
                return None
            kind = field.annotation
        elif typing.get_origin(kind) in (dict, list):
            kind = typing.get_args(kind)[-1]
        else:
            return None
        # `X | None` is X here: the None was not the problem.
        args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if typing.get_origin(kind) in (types.UnionType, typing.Union) and len(args) == 1:
            kind = args[0]
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def _shown(value: object) -> str:
    """A value as the file has it, cut short: a message is one line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
