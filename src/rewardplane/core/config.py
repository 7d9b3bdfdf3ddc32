"""The one config loader: pydantic models, YAML files, dotted overrides and one-line errors.

Every config in rewardplane (training, DPO, the service, deploy files, qualify plans) is a
`ConfigModel` read through this module, so they share one set of rules:

- unknown keys are refused, naming the dotted key and the nearest valid one
  ("unknown config key run.max_step (did you mean run.max_steps?)"), because a typo must
  never silently fall back to a default;
- types are strict (`true` is not an int, `"5"` is not an int, `"no"` is not a bool), except
  that a float also takes a numeric string: PyYAML (YAML 1.1) reads `1e-4` as a string;
- every failure is ONE line `ConfigError` (code "config") that starts with the dotted key;
- dtypes have one vocabulary (`Dtype`): fp32/fp16/bf16, plus float32/float/float16/half/bfloat16.

Porting a config onto it (a qualify plan, say)::

    class Plan(ConfigModel):
        name: str
        dtype: Dtype = "fp32"            # "float16" in the file reads back as "fp16"
        repeats: int = Field(3, ge=1)    # -> "repeats must be >= 1, got 0"

        @field_validator("name")
        @classmethod
        def _name(cls, v: str) -> str:
            if "/" in v:
                raise ValueError("must not contain '/'")   # -> "name must not contain '/'"
            return v

    plan = load(Plan, "plan.yaml", ["repeats=5"])    # file + overrides, validated
    plan = parse(Plan, doc, where="plans[2]")        # an already-read mapping; keys read plans[2].name

Validators raise `ValueError("must ...")` (the loader prefixes the dotted key), `FieldError(key,
...)` from a model validator whose rule is about one of the model's keys (reported at that key),
or, for checks whose message names keys of its own, `ConfigError` directly (passed through
unchanged). A section whose model is only known once another key is read (a scorer's `options`,
by its `kind`) is validated with `validate_section` from a validator of the field, and its errors
still read `scorers[2].options.timeout_s must be > 0`. Constructing a model directly
(`Plan(name=...)`) raises `ConfigError` too, never pydantic's `ValidationError`.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo, field_validator

from rewardplane.core.errors import ConfigError

__all__ = [
    "DTYPES",
    "ConfigModel",
    "Dtype",
    "FieldError",
    "apply_overrides",
    "canonical_dtype",
    "dump_yaml",
    "load",
    "parse",
    "read_config_data",
    "read_yaml",
    "to_dict",
    "validate_section",
]

# ---- dtypes ------------------------------------------------------------------------------

DTYPES = ("fp32", "fp16", "bf16")
_DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
}


def canonical_dtype(value: Any) -> str:
    """ "fp32", "fp16" or "bf16" for any accepted spelling (case-insensitive); ValueError otherwise."""
    canonical = _DTYPE_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
    if canonical is None:
        raise ValueError(
            f"must be one of {', '.join(DTYPES)} (or float32, float, float16, half, bfloat16), got {value!r}"
        )
    return canonical


Dtype = Annotated[str, BeforeValidator(canonical_dtype)]
"""A dtype field: any accepted spelling in, "fp32" / "fp16" / "bf16" out."""

# ---- models ------------------------------------------------------------------------------


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _takes_float(annotation: Any) -> bool:
    """float, float | None, list[float]: the fields where a YAML-1.1 string like "1e-4" is a number."""
    if annotation is float:
        return True
    if _is_union(annotation):
        return float in typing.get_args(annotation)
    return typing.get_origin(annotation) is list and typing.get_args(annotation) == (float,)


def _yaml_float(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value  # left for the float check to refuse with "expected float"
    return value


class ConfigModel(BaseModel):
    """Base of every config section: strict types, unknown keys refused, ConfigError on failure.

    Sections are mutable (assignment is validated too) unless a subclass sets `frozen=True`
    in its `model_config`. `.model_copy(update=...)` and `.model_dump()` replace
    `dataclasses.replace` / `asdict`.
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_one_line(type(self), exc, "")) from None

    # Marks this __init__ as pydantic's own, so nested sections are validated in one pass (and
    # report their dotted key) instead of through this wrapper.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(_one_line(type(self), exc, "")) from None

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_from_yaml_strings(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not _takes_float(field.annotation):
            return value
        if isinstance(value, list):
            return [_yaml_float(v) for v in value]
        return _yaml_float(value)


# ---- reading and overriding --------------------------------------------------------------


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (an empty file is `{}`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({' '.join(str(exc).split())})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings in place; values are parsed as YAML scalars (`1e-4`, `true`, `null`,
    `[a, b]`). Missing sections are created, so `data.synth.train_rows=10` works on an empty file."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key=value")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is not a section")
            node = child
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {key}: invalid YAML value ({' '.join(str(exc).split())})") from None
    return data


def read_config_data(path: str | Path | None, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """The YAML file (if any) with overrides applied, before validation: for checks that must
    see what the user wrote (e.g. whether a key was given at all)."""
    data = read_yaml(path) if path is not None else {}
    return apply_overrides(data, overrides)


# ---- validation --------------------------------------------------------------------------

M = typing.TypeVar("M", bound=BaseModel)


def parse(model_cls: type[M], data: Any, where: str = "") -> M:
    """Validate `data` (a mapping, e.g. from YAML) into `model_cls`.

    `where` is the dotted prefix of this mapping inside a larger document (`"scorers[0]"`), so
    error messages name the key as the user would find it.
    """
    try:
        return validate_section(model_cls, data)
    except _SectionInvalid as exc:
        raise ConfigError(_one_line(model_cls, exc.error, where)) from None
    except ValueError as exc:  # not a mapping
        raise ConfigError(f"{where or 'config'} {exc}") from None


class FieldError(ValueError):
    """Raised by a model validator about one of the model's own keys, so the loader reports it at
    that key: `FieldError("pattern", "needs exactly one capture group")` in the options of
    `scorers[0]` reads `scorers[0].options.pattern: needs exactly one capture group` (a message that
    starts with "must" follows the key without a colon, as for every validator)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key

    def line(self, where: str = "") -> str:
        """The one line the loader prints, for this error at `where` (its model's dotted key)."""
        return _keyed(_join(where, self.key), str(self))


class _SectionInvalid(ValueError):
    """A section validated inside a validator (`validate_section`) failed: the loader reports the
    inner problem at the field's dotted key followed by the inner key."""

    def __init__(self, model_cls: type[BaseModel], error: ValidationError) -> None:
        super().__init__(_one_line(model_cls, error, ""))
        self.model_cls, self.error = model_cls, error


def validate_section(model_cls: type[M], value: Any) -> M:
    """`value` (a mapping, None for all defaults, or already a `model_cls`) as `model_cls`, from
    inside a field validator: for a section whose model depends on another key (a scorer's
    `options` on its `kind`). Its errors read as if the field were annotated with `model_cls`:
    `scorers[2].options.timeout_s must be > 0`, unknown keys with the nearest valid one."""
    if isinstance(value, model_cls):
        return value
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {type(value).__name__}")
    try:
        return model_cls.model_validate(value)
    except ValidationError as exc:
        raise _SectionInvalid(model_cls, exc) from None


def load(model_cls: type[M], path: str | Path | None, overrides: Iterable[str] = ()) -> M:
    """`model_cls` from a YAML file (None: defaults only) plus `a.b.c=value` overrides."""
    return parse(model_cls, read_config_data(path, overrides))


def to_dict(config: BaseModel) -> dict[str, Any]:
    """Plain dicts and lists all the way down (what `dump_yaml` writes and `parse` reads back)."""
    return config.model_dump(mode="python")


def dump_yaml(config: BaseModel) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


# ---- messages ----------------------------------------------------------------------------

_EXPECTED = {
    "int_type": "int",
    "int_parsing": "int",
    "int_from_float": "int",
    "float_type": "float",
    "float_parsing": "float",
    "bool_type": "bool",
    "bool_parsing": "bool",
    "string_type": "str",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _field_annotation(annotation: Any) -> Any:
    """The annotation with `X | None` reduced to X."""
    if _is_union(annotation):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _element(annotation: Any) -> Any:
    """What an index or a mapping key leads to inside `annotation` (list[X], tuple[X, ...], dict[K, X])."""
    args = typing.get_args(_field_annotation(annotation))
    return _field_annotation(args[-1]) if args else None


def _walk(model_cls: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, type[BaseModel] | None]:
    """The dotted key for pydantic's `loc`, and the model the last key belongs to.

    Union members add a tag to `loc` ('list[str]', "literal['auto']"); they are skipped.
    """
    parts: list[str] = []
    node: Any = model_cls
    owner: type[BaseModel] | None = model_cls
    skip_tag = False
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
            node = _element(node)
            continue
        if skip_tag:
            skip_tag = False
            continue
        owner = node if isinstance(node, type) and issubclass(node, BaseModel) else None
        if owner is not None and item in owner.model_fields:
            annotation = owner.model_fields[item].annotation
            parts.append(item)
            skip_tag = _is_union(_field_annotation(annotation))
            node = _field_annotation(annotation)
        else:
            parts.append(str(item))
            node = _element(node)
    return "".join(p if p.startswith("[") or not i else f".{p}" for i, p in enumerate(parts)), owner


def _join(where: str, key: str) -> str:
    if not where:
        return key
    if not key:
        return where
    return f"{where}{key}" if key.startswith("[") else f"{where}.{key}"


def _one_line(model_cls: type[BaseModel], exc: ValidationError, where: str) -> str:
    """One line for the first problem (+ how many more), starting with the dotted key."""
    return _with_more(*_describe(model_cls, exc, where))


def _describe(model_cls: type[BaseModel], exc: ValidationError, where: str) -> tuple[str, int]:
    """The first problem's line and how many other keys have problems."""
    # an unknown key first: a misspelt required key is also "missing", and the typo is the news
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    key, owner = _walk(model_cls, tuple(first["loc"]))
    # a union reports once per member: count problems by key, not by error
    more = len({_walk(model_cls, tuple(e["loc"]))[0] for e in errors}) - 1
    key = _join(where, key)
    kind = first["type"]
    got = first.get("input")
    if kind == "extra_forbidden":
        section = key.rpartition(".")[0] if "." in key else where
        name = str(first["loc"][-1])
        unknown = sorted(
            str(e["loc"][-1])
            for e in errors
            if e["type"] == "extra_forbidden" and e["loc"][:-1] == first["loc"][:-1]
        )
        close = difflib.get_close_matches(name, list(owner.model_fields) if owner else [], n=1, cutoff=0.6)
        hint = f" (did you mean {_join(section, close[0])}?)" if close else ""
        message = f"unknown config key {key}{hint}; {section or 'the top level'} has unknown keys {unknown}"
        return message, more - len(unknown) + 1
    if kind == "missing":
        message = f"{key}: required key is missing"
    elif kind in _EXPECTED:
        message = f"{key}: expected {_EXPECTED[kind]}, got {got!r}"
    elif kind == "literal_error":
        message = f"{key}: {got!r} is not one of {first['ctx']['expected']}"
    elif kind in _BOUNDS:
        bound = next(iter(first["ctx"].values()))
        message = f"{key} must be {_BOUNDS[kind]} {bound}, got {got!r}"
    elif kind in ("frozen_instance", "frozen_field"):
        message = f"{key}: this config is frozen; make a changed copy with .model_copy(update=...)"
    elif kind == "too_short" and first["ctx"].get("min_length") == 1:
        message = f"{key} must be a non-empty list"
    elif kind == "value_error" and isinstance(first["ctx"]["error"], _SectionInvalid):
        inner = first["ctx"]["error"]
        message, inner_more = _describe(inner.model_cls, inner.error, key)
        return message, more + inner_more
    elif kind in ("value_error", "assertion_error"):
        error = first["ctx"]["error"]
        key = _join(key, error.key) if isinstance(error, FieldError) else key
        message = _keyed(key or where, str(error))
    else:
        message = _join_text(key, f"{first['msg']}, got {got!r}")
    return message, more


def _keyed(key: str, text: str) -> str:
    """A validator's message at its key: `key must ...`, `key: text`."""
    return f"{key or 'config'} {text}" if text.startswith("must") else _join_text(key, text)


def _join_text(key: str, text: str) -> str:
    return f"{key}: {text}" if key else text


def _with_more(message: str, more: int) -> str:
    return f"{message} (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else message
