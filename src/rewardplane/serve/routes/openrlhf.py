"""OpenRLHF's remote reward model protocol: `POST /get_reward` (OpenRLHF ≥ 0.11's
`--reward.remote_url`; `--remote_rm_url` before 0.11).

OpenRLHF's single-turn agent executor sends one sample per call,
`{"query": [text], "prompts": [prompt], "labels": [label]}`, where `query` is the whole decoded
sequence (prompt + response, special tokens kept) as the policy saw it, and reads `scores`
(else `rewards`) and `extra_logs` from the answer. It has no per-item errors: on any failure it
retries five times and then leaves the reward `None`. So here a failed item fails the whole
request with `{"code", "message", "kind"}`, where `code` is the item's own error code
(`bad_input`, `non_finite`, ...) and `kind` whose failure it is: never a made-up number. With
`?item_penalty=X` a failure of the item's own kind (a timeout, a crash, an unreadable judge
answer: the policy's doing) is rewarded X instead (`extra_logs["<scorer>/penalised"]` says
which); a service failure still fails the request, which OpenRLHF retries. `extra_logs` holds the score under the scorer's name
and, for a composite, its components (`component_logs`), which OpenRLHF logs with its metrics.

Modes (`?mode=`, default `raw`):
- `raw`: each query is scored as the text it is, the way OpenRLHF's own reward-model server
  does: text model scorers tokenise it with the reward model's tokenizer, no chat template and
  no added special tokens (`serve.protocol.RAW_TEXT`), and read the reward at its last
  token — so the end-of-sequence marker the policy emitted (`<|im_end|>`, `</s>`), kept in the
  query, is where the score is read. Except where the model was trained to be read later: a
  scorer with `complete_turn` (on for checkpoints that record `template_end`) appends what its
  chat template renders after that end-of-turn text (ChatML's newline) first, so the query
  scores what `/v1/score` gives the same conversation. Rule scorers (`length`, `regex`,
  `exact_match`) read the response field (with `labels[i]` as `reference`).
- `split`: the query is cut at `prompts[i]`; the prompt and the rest (the response, trailing
  end-of-sequence markers such as `<|im_end|>` or `</s>` removed) are scored as `/v1/score`
  scores a string prompt and response: rendered with the scorer's own chat template, or as the
  text plus EOS under the scorer's `plain_text: text_eos` (a model trained on plain text), for a
  policy whose chat format differs from the reward model's. A query that does not start with
  its prompt (left-truncated by the policy) is a `bad_input`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from rewardplane.serve.linear import compile_linear
from rewardplane.serve.protocol import (
    COMPONENTS,
    LEFT_OUT,
    RAW_TEXT,
    DetailedScore,
    ItemError,
    ScoreItem,
    ScorerInfo,
    ServeError,
    failure_kind,
    item_error_body,
    parse_trainer_body,
)
from rewardplane.serve.protocol.openrlhf import (
    OPENRLHF_MODES,
    OPENRLHF_ROUTE,
    OpenRLHFRewardRequest,
    OpenRLHFRewardResponse,
)
from rewardplane.serve.routes.context import RouteContext, error_response, raw_body
from rewardplane.serve.routes.score import OFF_LOOP_BYTES

BODY_MODELS = (OpenRLHFRewardRequest,)

# Item codes a caller can fix (its input); any other item failure is the service's (5xx).
INPUT_ITEM_CODES = frozenset({"bad_input", "too_long", "missing_reference", "bad_image"})

# A trailing run of special-token strings, as OpenRLHF decodes them (skip_special_tokens=False).
# RE2 (`serve/linear.py`): an end-anchored run of `\s*` tried from every position is quadratic
# in `re` on a long whitespace run; RE2 finds it in one linear pass.
_EOS_TAIL = compile_linear(r"(?:\s*(?:<\|[^<>|\s]{1,64}\|>|</s>|<eos>|<\|endoftext\|>))+\s*$")


def _parse(raw: bytes) -> OpenRLHFRewardRequest:
    body = parse_trainer_body(raw, OpenRLHFRewardRequest)
    n = len(body.query)
    for field in ("prompts", "labels"):
        value = getattr(body, field)
        if value is not None and len(value) != n:
            raise ServeError("invalid_request", f"{len(value)} {field} for {n} queries")
    return body


def strip_eos(text: str) -> str:
    """`text` without a trailing run of special-token strings and whitespace."""
    match = _EOS_TAIL.search(text)
    return text[: match.start()] if match else text


def _parse_items(raw: bytes, mode: str) -> tuple[OpenRLHFRewardRequest, list[ScoreItem | ItemError]]:
    body = _parse(raw)
    return body, build_items(body, mode)


def build_items(body: OpenRLHFRewardRequest, mode: str) -> list[ScoreItem | ItemError]:
    items: list[ScoreItem | ItemError] = []
    for i, query in enumerate(body.query):
        label = body.labels[i] if body.labels is not None else None
        if mode == "raw":
            items.append(
                ScoreItem(id=str(i), prompt="", response=query, reference=label, metadata={RAW_TEXT: True})
            )
            continue
        prompt = body.prompts[i] if body.prompts is not None else None
        if prompt is None:
            items.append(ItemError("bad_input", "mode=split needs prompts[i]"))
        elif not query.startswith(prompt):
            items.append(ItemError("bad_input", "query does not start with its prompt (left-truncated?)"))
        else:
            items.append(
                ScoreItem(id=str(i), prompt=prompt, response=strip_eos(query[len(prompt) :]), reference=label)
            )
    return items


def component_logs(name: str, info: ScorerInfo, results: list[Any]) -> dict[str, list[float]]:
    """A composite's components as OpenRLHF `extra_logs` keys, the same keys in every answer
    (OpenRLHF stacks each key over the samples): `<name>/<component>` per component, or, under
    `on_failure: renormalize` (where a left-out component has no number), `<name>/left_out`,
    the count left out of each query's reward. Empty for any other scorer."""
    if info.kind != "composite":
        return {}
    if info.options.get("on_failure") == "renormalize":
        return {f"{name}/left_out": [float(len(r.detail.get(LEFT_OUT, ()))) for r in results]}
    logs: dict[str, list[float]] = {}
    for component in (c["name"] for c in info.extra.get("components", ())):
        values = [DetailedScore.components_of(r).get(component) for r in results]
        if any(v is None for v in values):  # a total without its components: never made up
            raise ServeError("scorer_failed", f"scorer {name!r} answered without component {component!r}")
        logs[f"{name}/{component}"] = values  # type: ignore[assignment]
    return logs


def _penalty(value: float, info: ScorerInfo) -> DetailedScore:
    """`?item_penalty=` in place of an item's own failure; a composite's components all take it
    too, so `extra_logs` has a number for each (never one the scorer made up: it is the caller's)."""
    if info.kind != "composite":
        return DetailedScore(value, {})
    names = [c["name"] for c in info.extra.get("components", ())]
    return DetailedScore(value, {COMPONENTS: dict.fromkeys(names, value)})


def openrlhf_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()

    @router.post(
        OPENRLHF_ROUTE,
        response_model=OpenRLHFRewardResponse,
        summary="OpenRLHF remote reward model (--reward.remote_url http://HOST:PORT/get_reward)",
        openapi_extra=raw_body(OpenRLHFRewardRequest),
    )
    async def get_reward(
        request: Request, scorer: str | None = None, mode: str = "raw", item_penalty: float | None = None
    ) -> Response:
        started = time.perf_counter()
        try:
            if mode not in OPENRLHF_MODES:
                raise ServeError(
                    "invalid_request", f"mode must be one of {list(OPENRLHF_MODES)}, got {mode!r}"
                )
            if item_penalty is not None and not math.isfinite(item_penalty):
                raise ServeError(
                    "invalid_request", f"item_penalty must be a finite number, got {item_penalty}"
                )
            raw = await ctx.read_body(request)
            if len(raw) < OFF_LOOP_BYTES:
                body, built = _parse_items(raw, mode)
            else:  # a large body's JSON and text passes run in a thread, not on the event loop
                body, built = await asyncio.to_thread(_parse_items, raw, mode)
            if len(body.query) > ctx.limits.max_items:
                raise ServeError("too_many_items", f"{len(body.query)} queries exceed {ctx.limits.max_items}")
            names = ctx.backend.scorer_names()
            name = scorer if scorer is not None else (names[0] if names else "")
            unknown, loading = ctx.ready_names([name])
            if unknown:
                raise ServeError("unknown_scorer", f"unknown scorer {name!r}; known: {sorted(names)}")
            if loading:
                raise ServeError("not_ready", f"scorer {name!r} is not ready", retry_after=5)
            if ctx.backend.scorer_infos()[name].modality == "image_text":
                raise ServeError("invalid_request", f"scorer {name!r} needs images; OpenRLHF sends text")
            items = [x for x in built if isinstance(x, ScoreItem)]
            scored = (await ctx.score_all([name], items))[name] if items else []
        except ServeError as err:
            ctx.count(OPENRLHF_ROUTE, err.status, err.code, started)
            return error_response(err)
        it = iter(scored)
        results = [x if isinstance(x, ItemError) else next(it) for x in built]
        penalised = [0.0] * len(results)
        if item_penalty is not None:
            info = ctx.backend.scorer_infos()[name]
            for i, r in enumerate(results):
                if isinstance(r, ItemError) and failure_kind(r.code) == "item":
                    results[i], penalised[i] = _penalty(item_penalty, info), 1.0
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, ItemError)]
        if failed:
            i, first = failed[0]
            status = 422 if all(r.code in INPUT_ITEM_CODES for _, r in failed) else 500
            more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
            message = f"query {i}, scorer {name!r}: {first.message}{more}"
            ctx.count(OPENRLHF_ROUTE, status, first.code, started)
            return JSONResponse(item_error_body(first.code, message), status_code=status)
        values: list[Any] = [float(r) for r in results]
        try:
            logs = {name: values, **component_logs(name, ctx.backend.scorer_infos()[name], results)}
        except ServeError as err:
            ctx.count(OPENRLHF_ROUTE, err.status, err.code, started)
            return error_response(err)
        if item_penalty is not None:  # the same keys in every answer of a run (OpenRLHF stacks them)
            logs[f"{name}/penalised"] = penalised
        ctx.count(OPENRLHF_ROUTE, 200, "", started)
        out = {"rewards": values, "scores": values, "extra_logs": logs}
        if ctx.audit is not None:  # the audit's flat metrics, logged by OpenRLHF (docs/audit.md)
            out["extra_logs"].update({key: [value] * len(values) for key, value in ctx.audit.flat.items()})
        return Response(json.dumps(out, allow_nan=False), media_type="application/json")

    return router
