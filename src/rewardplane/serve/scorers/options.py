"""Scorer options: the base of every kind's options model, and their schema for people.

Each scorer kind declares its options as a pydantic model next to its code
(`class Options(ScorerOptions)` on the `Scorer` subclass, one attribute docstring per option: its
meaning). The one config loader (`core/config.py`) validates a spec's `options:` into that model
when the service, deploy or Ray config is read (`serve/config.py`), so an option error is one
line naming the dotted key (`scorers[2].options.timeout_s must be > 0`), an unknown key is
refused with the nearest valid one, and a scorer receives a typed, frozen options object.

The same models are the one source for what people read: `GET /v1/scorers` (each scorer's
options in effect, each hosted kind's `option_schema`) and the per-kind tables in docs/serve.md
(`options_table`; tests/serve/scorers/test_options.py compares them, so an option without a
doc line fails).
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticUndefined

from rewardplane.core.config import ConfigModel


class ScorerOptions(ConfigModel):
    """Base of every kind's options: strict types, unknown keys refused, frozen (the options are
    part of the scorer's identity). A kind that declares no options model takes none: any key
    under its `options:` is refused, as a typo would be."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)
    schema_name: ClassVar[str] = "mapping"

    not_in_identity: ClassVar[frozenset[str]] = frozenset()
    """Options that change how the work is done (pool sizes, caches, limits on the way to a
    score), never a score itself: left out of the identity, so tuning them keeps a client's pin."""

    def in_effect(self) -> dict[str, Any]:
        """Every option with the value in effect (defaults filled in), as JSON."""
        return self.model_dump(mode="json")

    def for_identity(self) -> dict[str, Any]:
        """The options that can change a score: what the identity hashes."""
        return {k: v for k, v in self.in_effect().items() if k not in self.not_in_identity}


def _type_name(annotation: Any) -> str:
    """A short, readable type: `int`, `float | null`, `'search' | 'fullmatch'`, `list[str]`."""
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, tuple):
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return getattr(annotation, "schema_name", annotation.__name__.lower())
    return getattr(annotation, "__name__", str(annotation))


def option_schema(model: type[BaseModel]) -> list[dict[str, Any]]:
    """One entry per option, in declaration order: name, type, required, default (JSON; absent
    when required), meaning (the attribute docstring) and whether the identity includes it."""
    out = []
    for name, field in model.model_fields.items():
        entry: dict[str, Any] = {"name": name, "type": _type_name(field.annotation)}
        if field.is_required():
            entry["required"] = True
        else:
            default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
            entry["required"] = False
            entry["default"] = None if default is PydanticUndefined else _json(default)
        entry["description"] = " ".join((field.description or "").split())
        entry["identity"] = name not in getattr(model, "not_in_identity", ())
        out.append(entry)
    return out


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def options_table(model: type[BaseModel]) -> str:
    """The markdown table docs/serve.md shows for one kind (generated; a test compares them)."""
    rows = ["| option | type | default | meaning |", "| --- | --- | --- | --- |"]
    for o in option_schema(model):
        default = "required" if o["required"] else f"`{json.dumps(o['default'])}`"
        meaning = o["description"] + ("" if o["identity"] else " Not part of the identity.")
        rows.append(f"| `{o['name']}` | {_cell(o['type'])} | {_cell(default)} | {_cell(meaning)} |")
    if len(rows) == 2:
        return "No options."
    return "\n".join(rows)
