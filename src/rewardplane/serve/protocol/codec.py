"""Items between the wire and `ScoreItem`, derived from the dataclass's fields (`items.py`).

- `ItemIn`: the request model of one item, built from `ScoreItem`'s fields and their `wire`
  metadata, so the two cannot disagree; `ItemIn.to_score_item(image)` goes back.
- `item_fields` / `item_from_fields`: an item's JSON fields (no image) and back, for JSON this
  service wrote itself (the deploy transport's frames).
- `item_to_wire`, `encode_score_request`, `join_score_request`: request bodies, images as
  base64 or as multipart parts.
- `image_bytes`: a wire image's bytes, from base64 or a multipart part.
- `read_items`: an items file (one wire item per JSON line), as `rewardplane score` and
  `rewardplane bench --inputs` read it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, create_model

from rewardplane.core.errors import UsageError
from rewardplane.serve.protocol.errors import ServeError
from rewardplane.serve.protocol.guards import Strict, first_error, load_json
from rewardplane.serve.protocol.items import WIRE, ImageIn, ScoreItem

IMAGE = "image"
"""The one binary field: raw bytes in a `ScoreItem`, `{"b64"}` or `{"part"}` on the wire."""
_FIELDS = dataclasses.fields(ScoreItem)
_JSON_FIELDS = tuple(f for f in _FIELDS if f.name != IMAGE)
_ALWAYS = frozenset(f.name for f in _JSON_FIELDS if f.default is dataclasses.MISSING)
"""Fields sent even when empty; the others only when set (not None)."""
_NAMES = tuple(f.name for f in _JSON_FIELDS)


def _plain(value: Any) -> Any:
    """A validated wire value as the plain Python a scorer sees (messages as dicts)."""
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return [dict(m) for m in value]
    return value


class _ItemBase(Strict):
    def to_score_item(self, image: bytes | None) -> ScoreItem:
        """This item as a `ScoreItem`, with `image` already resolved to bytes."""
        return ScoreItem(**{name: _plain(getattr(self, name)) for name in _NAMES}, image=image)


def _item_model() -> type[_ItemBase]:
    hints = get_type_hints(ScoreItem)
    spec: dict[str, Any] = {}
    for f in _FIELDS:
        type_, settings = f.metadata.get(WIRE, (None, {}))
        settings = dict(settings)
        if f.default is not dataclasses.MISSING:
            settings.setdefault("default", f.default)
        spec[f.name] = (type_ if type_ is not None else hints[f.name], Field(**settings))
    return create_model("ItemIn", __base__=_ItemBase, __module__=__name__, **spec)


ItemIn = _item_model()
"""One item of `POST /v1/score`: `ScoreItem`'s fields in their wire form."""


def item_fields(item: ScoreItem) -> dict[str, Any]:
    """An item's JSON fields without its image; optional fields only when set."""
    out: dict[str, Any] = {}
    for name in _NAMES:
        value = getattr(item, name)
        if value is not None or name in _ALWAYS:
            out[name] = value
    return out


def item_from_fields(entry: Mapping[str, Any], image: bytes | None) -> ScoreItem:
    """The inverse of `item_fields`, for JSON this service wrote itself (the deploy transport):
    no schema check, which the HTTP front already made."""
    values = {name: entry.get(name) for name in _NAMES}
    values["id"] = str(values["id"])
    return ScoreItem(**values, image=image)


def _b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode("ascii")}


def item_to_wire(item: ScoreItem | Mapping[str, Any]) -> dict[str, Any]:
    """One `ItemIn` as JSON, image as base64. A mapping is sent as given, except raw image bytes."""
    if isinstance(item, ScoreItem):
        out = item_fields(item)
        if item.image is not None:
            out[IMAGE] = _b64(item.image)
        return out
    out = dict(item)
    if isinstance(out.get(IMAGE), bytes | bytearray):
        out[IMAGE] = _b64(bytes(out[IMAGE]))
    return out


def encode_score_request(
    items: Iterable[ScoreItem | Mapping[str, Any]],
    scorers: Sequence[str],
    pin: Mapping[str, str] | None = None,
    *,
    multipart: bool = False,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(the `ScoreRequest` JSON, image parts). With `multipart`, every base64 image becomes a
    part `image<n>` referred to as `{"part": "image<n>"}`; otherwise parts is empty."""
    payload: dict[str, Any] = {"scorers": list(scorers), "items": [item_to_wire(i) for i in items]}
    if pin:
        payload["pin"] = dict(pin)
    parts: dict[str, bytes] = {}
    if multipart:
        for n, entry in enumerate(payload["items"]):
            image = entry.get(IMAGE)
            if isinstance(image, dict) and "b64" in image:
                name = f"image{n}"
                parts[name] = base64.b64decode(image["b64"])
                entry[IMAGE] = {"part": name}
    return payload, parts


def join_score_request(scorers: Sequence[str], encoded_items: Iterable[bytes]) -> bytes:
    """A JSON `ScoreRequest` body from items already JSON-encoded (`item_to_wire` + json.dumps),
    so a load generator encodes each item once, not once per request."""
    return (
        b'{"scorers":' + json.dumps(list(scorers)).encode() + b',"items":[' + b",".join(encoded_items) + b"]}"
    )


def image_bytes(image: ImageIn, parts: Mapping[str, bytes], where: str) -> bytes:
    """A wire image's bytes, from base64 or from the named multipart part (422 otherwise)."""
    if (image.b64 is None) == (image.part is None):
        raise ServeError("invalid_request", f"{where} needs exactly one of b64 or part")
    if image.b64 is not None:
        try:
            return base64.b64decode(image.b64, validate=True)
        except (binascii.Error, ValueError):
            raise ServeError("bad_image", f"{where}.b64 is not valid base64") from None
    if image.part not in parts:
        raise ServeError("invalid_request", f"{where}.part {image.part!r} not in body")
    return parts[image.part]


_ITEM = TypeAdapter(ItemIn)


BAD_LINE = "bad_line"
"""The code of a `UsageError` about one line of an items file (`read_items`)."""


def read_items(path: str | Path, *, bad: list[tuple[int, str]] | None = None) -> list[ScoreItem]:
    """An items file: one wire item (`ItemIn`) per JSON line, checked as the service checks
    one, except that `image` may also be a path (relative to the file), and `image_path` /
    `image_b64` (the `rewardplane bench --inputs` names) stand for `image`. Ids must be unique:
    scores are written and compared per id. A bad line is a one-line `UsageError`; given a
    `bad` list, it is appended there as (line number, reason) and the other lines are read."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path} does not exist")
    items: list[ScoreItem] = []
    ids: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = _read_line(line, path.parent, f"{path}:{lineno}")
            if item.id in ids:
                raise UsageError(f"{path}:{lineno}: duplicate id {item.id!r}", code=BAD_LINE)
        except UsageError as exc:
            if bad is None:
                raise
            bad.append((lineno, str(exc).removeprefix(f"{path}:{lineno}: ")))
            continue
        ids.add(item.id)
        items.append(item)
    if not items:
        bad_lines = f" ({len(bad)} bad line{'' if len(bad) == 1 else 's'})" if bad else ""
        raise UsageError(f"{path}: no items{bad_lines}")
    return items


def _read_line(line: str, folder: Path, where: str) -> ScoreItem:
    """One line of an items file as a `ScoreItem`; a `UsageError` naming `where` if it is not one."""
    try:
        row = load_json(line, what="line")
        if not isinstance(row, dict):
            raise UsageError(f"{where}: expected a JSON object", code=BAD_LINE)
        image = _image_file(row, folder, where)
        wire_item = _ITEM.validate_python(row, strict=True)
        if wire_item.image is not None:
            image = image_bytes(wire_item.image, {}, "image")
    except UsageError as exc:
        raise UsageError(exc.message, code=BAD_LINE) from None
    except ServeError as exc:
        raise UsageError(f"{where}: {exc.message}", code=BAD_LINE) from None
    except ValidationError as exc:
        raise UsageError(f"{where}: {first_error(exc)}", code=BAD_LINE) from None
    return wire_item.to_score_item(image)


def _image_file(row: dict[str, Any], folder: Path, where: str) -> bytes | None:
    """Takes the file forms of an image (a path as `image` or `image_path`, `image_b64`) out of
    `row` and returns their bytes; `{"b64"}` stays for the wire model to check."""
    image_path = row.pop("image_path", None)
    if isinstance(row.get(IMAGE), str):
        image_path = row.pop(IMAGE)
    b64 = row.pop("image_b64", None)
    if image_path is not None:
        file = folder / str(image_path)
        if not file.is_file():
            raise UsageError(f"{where}: image {image_path} not found")
        return file.read_bytes()
    if b64 is not None:
        return image_bytes(ImageIn(b64=str(b64)), {}, "image")
    return None
