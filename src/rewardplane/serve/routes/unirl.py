"""The UniRL reward protocol "1" (UniRL's `RemoteRewardBackend` and its reward service).

`POST /score` takes `{"protocol_version": "1", "requests": [...]}`; each request names its
`required_rewards` (here: scorer names) and carries a `history` of `{text, image_b64}` turns.
The scored turn is `history[-1]`: for image scorers its caption and image (an image-to-image
request's earlier conditioning turn is not scored); for text scorers, as an extension, the last
turn's text is the response and the earlier turns' texts are the prompt (user turns).
`metadata.reference` (else `metadata.answer`) becomes the item's `reference`.

The answer keeps request order: `results[i][reward] = {"score": value}` (a composite adds each
of its components' scores after the total: `{"score": total, "<component>": value, ...}`; a
component left out by `on_failure: renormalize` has no key, never a number) or
`errors[i][reward] = "code: message"` (per reward, so one failing scorer leaves the others;
as an extension `error_kinds[i][reward]` says whose failure it is, `item` or `service`),
and `identities[i]` echoes `request_id`, `sample_id`, `group_id`, `source_rank`,
`policy_version` and `idempotency_key` exactly, with `scorer_version` = the scorer's identity
(docs/serve.md "Identity"). A non-finite value is an error, never sent as a number.

400 for an unknown reward, a protocol version other than "1", a `scorer_version` pin that does
not match (or pins a request with several rewards), video or CUDA-IPC turns, and `grad_mode`.
An `idempotency_key` seen before with the same payload replays the stored answer; with a
different payload the request is a 409. Only fully scored requests are stored (LRU, bounded),
so retrying after a failure scores again.

`POST /score` runs four named steps: `check_request` (every whole-request refusal, in order),
`IdempotencyCache.replay` (keys seen before or repeated in the batch), `score_rewards` (build
each reward's items and score them) and `answer`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from rewardplane.serve.protocol import (
    DetailedScore,
    ErrorOut,
    ItemError,
    ScoreItem,
    ServeError,
    error_body,
    failure_kind,
    parse_trainer_body,
)
from rewardplane.serve.protocol import unirl as wire
from rewardplane.serve.routes.context import RouteContext, error_response, raw_body

IDEMPOTENCY_CACHE_SIZE = 65536
BODY_MODELS = (wire.UniRLScoreRequest,)


class _UniRLError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _fingerprint(req: wire.UniRLRequestItem) -> str:
    payload = req.model_dump(mode="json", exclude={"idempotency_key"})
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()


def _identity(req: wire.UniRLRequestItem, scorer_version: str | None) -> dict[str, Any]:
    return {
        "request_id": req.request_id,
        "sample_id": req.sample_id,
        "group_id": req.group_id,
        "source_rank": req.source_rank,
        "policy_version": req.policy_version,
        "scorer_version": scorer_version,
        "idempotency_key": req.idempotency_key,
    }


def _metadata(req: wire.UniRLRequestItem) -> dict[str, Any] | None:
    """The request's metadata with its `policy_version` added, where the audit stream reads the
    policy version of every item (docs/audit.md); a version already in the metadata wins."""
    if req.policy_version is None or (req.metadata is not None and "policy_version" in req.metadata):
        return req.metadata
    return {**(req.metadata or {}), "policy_version": req.policy_version}


def _item(index: int, req: wire.UniRLRequestItem, image_text: bool) -> ScoreItem | ItemError:
    """The `ScoreItem` a scorer sees for request `index` (an image scorer's when `image_text`,
    else a text or rule scorer's), or why it cannot have one."""
    last = req.history[-1]
    if last.video_b64 is not None or last.video_path is not None:
        return ItemError("bad_input", "video turns are not supported by this service")
    meta = req.metadata
    reference = None if meta is None else meta.get("reference", meta.get("answer"))
    group = None if req.group_id is None else str(req.group_id)
    if not image_text:  # text and rule scorers
        if not last.text:
            return ItemError("bad_input", "the last turn has no text to score")
        # The earlier turns are user messages, one or several: a conversation, never a plain
        # string (a text scorer under `plain_text: text_eos` tokenises string prompts as text).
        prompt: str | list[dict[str, str]] = [
            {"role": "user", "content": t.text} for t in req.history[:-1] if t.text
        ] or ""
        return ScoreItem(
            id=str(index),
            prompt=prompt,
            response=last.text,
            reference=reference,
            group_id=group,
            metadata=_metadata(req),
        )
    if last.image_b64 is None:
        return ItemError("missing_image", "the last turn has no image_b64")
    try:
        image = base64.b64decode(last.image_b64, validate=True)
    except (binascii.Error, ValueError):
        return ItemError("bad_image", "image_b64 is not valid base64")
    return ScoreItem(
        id=str(index),
        prompt=last.text,
        response="",
        image=image,
        reference=reference,
        group_id=group,
        metadata=_metadata(req),
    )


@dataclass
class Checked:
    """A request that passed every whole-request check: its rewards in first-seen order and the
    identity each is served under."""

    requests: list[wire.UniRLRequestItem]
    names: list[str]
    version: dict[str, str]
    keyed: bool


def check_request(ctx: RouteContext, body: wire.UniRLScoreRequest) -> Checked:
    """Every whole-request refusal, in order; the first bad request (in order) answers."""
    if body.protocol_version != wire.UNIRL_PROTOCOL_VERSION:
        raise _UniRLError(
            400, "unsupported_protocol", f"unsupported protocol_version={body.protocol_version!r}"
        )
    if body.grad_mode:
        raise _UniRLError(400, "unsupported_input", "grad_mode is not supported by this service")
    reqs = body.requests
    if len(reqs) > ctx.limits.max_items:
        raise ServeError("too_many_items", f"{len(reqs)} requests exceed {ctx.limits.max_items}")
    names = list(dict.fromkeys(n for r in reqs for n in r.required_rewards))
    unknown, loading = ctx.ready_names(names)
    if unknown:
        raise _UniRLError(
            400, "unknown_scorer", f"unknown reward: {unknown}. available: {ctx.backend.scorer_names()}"
        )
    if loading:
        raise ServeError("not_ready", f"rewards {loading} are not ready", retry_after=5)
    infos = ctx.backend.scorer_infos()
    version = {n: infos[n].identity for n in names}
    for i, r in enumerate(reqs):
        if any(t.image_ipc is not None for t in r.history):
            raise _UniRLError(400, "unsupported_input", f"requests[{i}]: image_ipc needs a handshake")
        if r.scorer_version is not None:
            pinned = [version[n] for n in r.required_rewards]
            if len(pinned) != 1 or pinned[0] != r.scorer_version:
                raise _UniRLError(
                    400,
                    "scorer_version_mismatch",
                    f"requests[{i}] pins scorer_version {r.scorer_version!r}; "
                    f"{dict(zip(r.required_rewards, pinned, strict=True))} is served "
                    "(a pin needs exactly one required reward)",
                )
    return Checked(reqs, names, version, any(r.idempotency_key for r in reqs))


Results = list[dict[str, dict[str, float]] | None]


@dataclass
class Replay:
    """What the idempotency cache decided for one batch: the answers replayed, the requests to
    score (`todo`), each key's first request and each keyed request's fingerprint."""

    results: Results
    todo: list[int]
    first_of_key: dict[str, int] = field(default_factory=dict)
    prints: list[str] = field(default_factory=list)


class IdempotencyCache:
    """Answers of fully scored keyed requests, LRU-bounded: a key seen again with the same
    payload replays its answer, with another payload is a 409."""

    def __init__(self, size: int = IDEMPOTENCY_CACHE_SIZE) -> None:
        self.size = size
        self.entries: OrderedDict[str, tuple[str, dict[str, dict[str, float]]]] = OrderedDict()

    def replay(self, checked: Checked) -> Replay:
        reqs = checked.requests
        plan = Replay([None] * len(reqs), list(range(len(reqs))))
        if not checked.keyed:
            return plan
        # only keyed requests are fingerprinted: a dump + sort + sha256 per request doubled this
        # route's per-item cost for the common, unkeyed case
        plan.prints = [_fingerprint(r) if r.idempotency_key else "" for r in reqs]
        for i, r in enumerate(reqs):
            if not (key := r.idempotency_key):
                continue
            if key in plan.first_of_key:
                if plan.prints[plan.first_of_key[key]] != plan.prints[i]:
                    raise _UniRLError(
                        409, "idempotency_conflict", f"idempotency key {key!r} reused in one batch"
                    )
                continue
            plan.first_of_key[key] = i
            if (hit := self.entries.get(key)) is not None:
                if hit[0] != plan.prints[i]:
                    raise _UniRLError(
                        409,
                        "idempotency_conflict",
                        f"idempotency key {key!r} was used for a different payload",
                    )
                self.entries.move_to_end(key)
                plan.results[i] = {n: dict(v) for n, v in hit[1].items()}
        plan.todo = [
            i
            for i, r in enumerate(reqs)
            if plan.results[i] is None
            and not (r.idempotency_key and plan.first_of_key[r.idempotency_key] != i)
        ]
        return plan

    def store(self, checked: Checked, plan: Replay, failed: Failures) -> None:
        """A key's duplicates share its answer; only fully scored requests are stored."""
        errors, kinds = failed
        if not checked.keyed:
            return
        fresh = set(plan.todo)
        for i, r in enumerate(checked.requests):
            if not (key := r.idempotency_key):
                continue
            if (j := plan.first_of_key[key]) != i:
                plan.results[i], errors[i], kinds[i] = dict(plan.results[j]), dict(errors[j]), dict(kinds[j])
            elif i in fresh and not errors[i]:
                self.entries[key] = (plan.prints[i], plan.results[i])
                self.entries.move_to_end(key)
                while len(self.entries) > self.size:
                    self.entries.popitem(last=False)


Failures = tuple[list[dict[str, str]], list[dict[str, str]]]
"""Per request, reward -> `"code: message"`, and reward -> whose failure it is (`item` / `service`)."""


async def score_rewards(ctx: RouteContext, checked: Checked, plan: Replay) -> Failures:
    """Build each reward's items (one per request and modality, shared by the rewards that read
    it) and score them: the total first (the metric a client reads), then a composite's
    components, into `plan.results`; per-reward failures (and their kinds) returned."""
    reqs, names = checked.requests, checked.names
    errors: list[dict[str, str]] = [{} for _ in reqs]
    kinds: list[dict[str, str]] = [{} for _ in reqs]
    for i in plan.todo:
        plan.results[i] = {}
    infos = ctx.backend.scorer_infos()
    built: dict[bool, dict[int, ScoreItem | ItemError]] = {}
    for name in names:
        image_text = infos[name].modality == "image_text"
        items = built.setdefault(image_text, {})
        rows = plan.todo if len(names) == 1 else [i for i in plan.todo if name in reqs[i].required_rewards]
        ok: list[tuple[int, ScoreItem]] = []
        for i in rows:
            x = items.get(i)
            if x is None:
                x = items[i] = _item(i, reqs[i], image_text)
            if isinstance(x, ItemError):
                errors[i][name], kinds[i][name] = f"{x.code}: {x.message}", failure_kind(x.code)
            else:
                ok.append((i, x))
        if not ok:
            continue
        scored = (await ctx.score_all([name], [x for _, x in ok]))[name]
        for (i, _), value in zip(ok, scored, strict=True):
            if isinstance(value, ItemError):
                errors[i][name], kinds[i][name] = f"{value.code}: {value.message}", failure_kind(value.code)
            else:
                plan.results[i][name] = {
                    wire.UNIRL_METRIC: float(value),
                    **DetailedScore.components_of(value),
                }
    return errors, kinds


def answer(checked: Checked, results: Results, failed: Failures) -> Response:
    """The 200 body: results and errors in request order, each request's identity echoed with
    the scorer version it was served under (several rewards: their versions joined by ",")."""
    version = checked.version
    identities = [_identity(r, ",".join(version[n] for n in r.required_rewards)) for r in checked.requests]
    out = {
        "protocol_version": wire.UNIRL_PROTOCOL_VERSION,
        "results": results,
        "errors": failed[0],
        "error_kinds": failed[1],
        "identities": identities,
    }
    return Response(json.dumps(out, allow_nan=False), media_type="application/json")


def unirl_router(ctx: RouteContext) -> APIRouter:
    router = APIRouter()
    cache = IdempotencyCache()

    @router.post(
        wire.UNIRL_SCORE_ROUTE,
        response_model=wire.UniRLScoreResponse,
        summary="UniRL reward protocol 1",
        openapi_extra=raw_body(wire.UniRLScoreRequest),
        responses={status: {"model": ErrorOut} for status in (400, 401, 413, 422, 429, 500, 503, 504)},
    )
    async def score(request: Request) -> Response:
        started = time.perf_counter()
        try:
            checked = check_request(
                ctx, parse_trainer_body(await ctx.read_body(request), wire.UniRLScoreRequest)
            )
            plan = cache.replay(checked)
            failed = await score_rewards(ctx, checked, plan)
            cache.store(checked, plan, failed)
        except _UniRLError as err:
            ctx.count(wire.UNIRL_SCORE_ROUTE, err.status, err.code, started)
            return JSONResponse(error_body(err.code, err.message), status_code=err.status)
        except ServeError as err:
            ctx.count(wire.UNIRL_SCORE_ROUTE, err.status, err.code, started)
            return error_response(err)
        ctx.count(wire.UNIRL_SCORE_ROUTE, 200, "", started)
        return answer(checked, plan.results, failed)

    @router.get(wire.UNIRL_HEALTH_ROUTE, response_model=wire.UniRLHealth)
    async def health() -> dict[str, Any]:
        _, details = ctx.backend.ready()
        rewards = {}
        for name in ctx.backend.scorer_names():
            status = details.get(name, "unknown")
            rewards[name] = [status if isinstance(status, str) else json.dumps(status, default=str)]
        return {"status": "ok", "rewards": rewards}

    @router.get(wire.UNIRL_REWARDS_ROUTE, response_model=wire.UniRLRewards)
    async def rewards() -> dict[str, list[str]]:
        return {"rewards": list(ctx.backend.scorer_names())}

    return router
