"""`composite` scorer: several scorers combined into one reward, optionally normalised per group
(configuration, failures and group normalisation for users: docs/serve.md, "How a `composite`
behaves").

What the code below keeps to, and why:
- Components are inline (built and owned here, moved by this scorer's offload/onload) or name a
  scorer of the same server (scored through its own queue and admitted through its lifecycle,
  exactly as a direct request); all run concurrently, each on the whole batch.
- Every score is a `CompositeScore` carrying each component's own score, so the response can
  give trainers the components beside the total; no component is named `score`.
- The composite admits nothing itself: each component applies its own admission contract.
- A failed component fails the item (the total is an error, never a number). Under
  `on_failure: renormalize` a failure counts by its kind: a service failure is left out and the
  others' weights rescaled; an item failure (the policy's doing) is never renormalised over, it
  counts as the component's lowest score, or fails the item where there is none.
- Group normalisation divides by nothing degenerate (a std of 0 gives exactly 0.0) and needs
  every item of a `group_id` group in the batch and scored, else `group_incomplete`.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from rewardplane.core.config import FieldError
from rewardplane.core.errors import ConfigError
from rewardplane.serve.admission import admitted
from rewardplane.serve.protocol import (
    COMPONENT_ERRORS,
    COMPONENTS,
    FLOORED,
    LEFT_OUT,
    DetailedScore,
    ItemError,
    ScoreItem,
    failure_kind,
    item_error_body,
)
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.options import ScorerOptions
from rewardplane.serve.scorers.registry import KindSpec, ScorerSpec, build_scorer

INLINE_KEYS = frozenset({"kind", "options", "path", "shape", "dtype", "device"})
RESERVED_NAME = "score"
"""No component has this name: UniRL's and verl's answers hold the total under it."""


class CompositeScore(DetailedScore):
    """A composite's total for one item, with each component's score (`components`), the
    components left out of it (`left_out`: the service's failures) and those counted at their
    lowest score (`floored`: the item's own failures), with their errors; the response carries
    them as `details[<composite>]`."""

    def __new__(
        cls,
        value: float,
        components: dict[str, float] | None = None,
        left_out: dict[str, ItemError] | None = None,
        floored: dict[str, ItemError] | None = None,
    ) -> CompositeScore:
        detail: dict[str, Any] = {COMPONENTS: dict(components or {})}
        if left_out:
            detail[LEFT_OUT] = list(left_out)
        if floored:
            detail[FLOORED] = list(floored)
        failed = {**(left_out or {}), **(floored or {})}
        if failed:
            detail[COMPONENT_ERRORS] = {n: item_error_body(e.code, e.message) for n, e in failed.items()}
        return super().__new__(cls, value, detail)

    @property
    def left_out(self) -> tuple[str, ...]:
        return tuple(self.detail.get(LEFT_OUT, ()))

    def with_value(self, value: float) -> CompositeScore:
        """The same components and left-out ones with another total (a group-normalised one)."""
        out = CompositeScore(value)
        out.detail = self.detail
        return out


def _checked(value: object) -> float | ItemError:
    if isinstance(value, ItemError):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ItemError("scorer_failed", f"returned {type(value).__name__}, not a number")
    value = float(value)
    if not math.isfinite(value):
        return ItemError("non_finite", f"produced {value}")
    return value


def group_normalize(values: list[float], *, scale: str = "std", ddof: int = 1) -> list[float]:
    """(r - mean) / std over one group; every value is 0.0 when std is 0 or undefined."""
    n = len(values)
    mean = sum(values) / n
    centred = [v - mean for v in values]
    if scale == "none":
        return centred
    if n - ddof <= 0:
        return [0.0] * n
    std = math.sqrt(sum(c * c for c in centred) / (n - ddof))
    if std == 0.0 or not math.isfinite(std):
        return [0.0] * n
    return [c / std for c in centred]


class Component(KindSpec):
    """One component: configured inline (`kind` and `options`, plus `path`, `shape`, `dtype`,
    `device` for a model kind, exactly as a top-level scorer) or a scorer this server hosts
    (`scorer: NAME`), scored as that scorer is configured."""

    model_config = ConfigDict(use_attribute_docstrings=True)
    schema_name: ClassVar[str] = "component"

    name: str = Field(min_length=1)
    """The component's name (not `score`): its key in `details.components` and the trainers'
    answers, in `GET /v1/scorers`; unique in the composite."""
    kind: str | None = None
    """The scorer kind of an inline component (any kind but `composite`)."""
    scorer: str | None = Field(None, min_length=1)
    """Instead of `kind`: another scorer of this server, scored through its own queue and lifecycle."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """The component's weight (`weighted_sum`, `mean`); must stay 1 with `min` / `max`."""
    required: bool = False
    """With `on_failure: renormalize`: this component's failure still fails the item."""
    floor: float | None = Field(None, allow_inf_nan=False)
    """With `on_failure: renormalize`: the score an item-kind failure of this component (a
    timeout, a crash, an unreadable judge answer: the policy's doing) counts as; null: the kind's
    lowest score (0.0 for the verifiers and rules); a kind without one (a reward model) fails the item."""

    @field_validator("kind")
    @classmethod
    def _not_nested(cls, kind: str | None) -> str | None:
        if kind == "composite":
            raise ValueError("must name a non-composite scorer kind (components do not nest)")
        return kind

    @model_validator(mode="after")
    def _inline_or_hosted(self) -> Component:
        if self.scorer is not None:
            inline = sorted(self.model_fields_set & INLINE_KEYS)
            if inline:
                raise ValueError(
                    f"names hosted scorer {self.scorer!r}, which is scored as it is configured; drop {inline}"
                )
        elif self.kind is None:
            raise FieldError("kind", "must be set (or scorer: NAME, a scorer of this server)")
        return self


class CompositeOptions(ScorerOptions):
    components: list[Component] = Field(min_length=1)
    """The scorers combined (keys in the component table below)."""
    aggregation: Literal["weighted_sum", "mean", "min", "max"] = "weighted_sum"
    """Σ w·s, Σ w·s / Σ w, or the min / max over the components' scores."""
    on_failure: Literal["fail", "renormalize"] = "fail"
    """A failed component fails the item; or a service failure is left out and the rest reweighted, an item failure counts as the component's `floor` (unless `required`)."""
    group_normalize: bool = False
    """After aggregation, (r - mean) / std over the items of one `group_id` (GRPO)."""
    group_size: int | None = Field(None, ge=1)
    """Items per group; required with `group_normalize`, at most `max_batch_size` (a group is
    normalised only when whole in one batch; the batcher never splits a request's group)."""
    group_scale: Literal["std", "none"] = "std"
    """Divide by the group's std, or only subtract its mean (Dr. GRPO)."""
    std_ddof: Literal[0, 1] = 1
    """1: sample std (torch.std, as TRL and verl); 0: population std."""

    @model_validator(mode="after")
    def _rules(self) -> CompositeOptions:
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise FieldError("components", f"component names must be unique, got {names}")
        if RESERVED_NAME in names:
            raise FieldError(
                f"components[{names.index(RESERVED_NAME)}].name",
                f"{RESERVED_NAME!r} is the total's key in UniRL's and verl's answers; name the component otherwise",
            )
        if self.group_normalize and self.group_size is None:
            raise FieldError("group_size", "must be set with group_normalize (items per group, >= 1)")
        agg = self.aggregation
        for i, c in enumerate(self.components):
            if agg in ("min", "max") and c.weight != 1.0:
                raise FieldError(f"components[{i}].weight", f"weights have no meaning with aggregation {agg}")
            if agg == "mean" and c.weight < 0:
                raise FieldError(f"components[{i}].weight", "must be >= 0 with aggregation mean")
        if agg == "mean" and sum(c.weight for c in self.components) <= 0:
            raise FieldError("components", "mean needs a positive total weight")
        return self


class CompositeScorer(Scorer):
    """The components scored on the whole batch at once, then aggregated per item (module docstring)."""

    kind: ClassVar[str] = "composite"
    modality: ClassVar = "rule"
    Options = CompositeOptions
    reads: ClassVar[frozenset[str]] = frozenset()
    """None itself: each component admits the items by its own declaration (module docstring)."""

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        self.components: list[Component] = list(self.options.components)
        self.scorers: list[Any] = []  # per component: its own Scorer, or a hosted scorer's handle
        self._hosted: dict[str, Any] = {}
        self.left_out_counts: dict[str, int] = {c.name: 0 for c in self.components}
        self._pool = ThreadPoolExecutor(
            max_workers=len(self.components), thread_name_prefix=f"composite-{name}"
        )
        self._warmup = ScoreItem(id="warmup", prompt="", response="")

    @property
    def groups_in_one_batch(self) -> bool:  # type: ignore[override]
        """Normalising per group: a group's items are scored in one batch."""
        return self.options.group_normalize

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        o = spec.options
        batch = getattr(spec, "max_batch_size", None)  # a component spec has none
        if o.group_normalize and o.group_size is not None and batch is not None and o.group_size > batch:
            raise FieldError(
                "options.group_size",
                f"{o.group_size} items per group cannot fit max_batch_size {batch}: a group is"
                f" normalised only when it is whole in one batch; raise max_batch_size to at least {o.group_size}",
            )
        for i, c in enumerate(spec.options.components):
            if c.scorer == spec.name:
                raise FieldError(
                    f"options.components[{i}].scorer", "must name another scorer of this server, not itself"
                )

    def hosted_references(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.scorer for c in self.components if c.scorer))

    def bind_hosted(self, hosted: dict[str, Any]) -> None:
        self._hosted = dict(hosted)

    def load(self) -> None:
        scorers: list[Any] = []
        for c in self.components:
            if c.scorer:
                if c.scorer not in self._hosted:
                    raise ConfigError(
                        f"scorer {self.name!r} (composite): component {c.name!r} names scorer "
                        f"{c.scorer!r}, which this process does not host"
                    )
                scorers.append(self._hosted[c.scorer])
                continue
            inline = c.model_dump(include=set(INLINE_KEYS - {"options"}))
            spec = ScorerSpec(
                name=f"{self.name}.{c.name}", max_batch_size=self.max_batch_size, options=c.options, **inline
            )
            scorers.append(build_scorer(spec))
        for c, s in zip(self.components, scorers, strict=True):
            if not c.scorer:
                s.load()
        self.scorers = scorers

    def item_fields(self) -> frozenset[str]:
        """Its components' fields (hosted ones included): what a client must send it."""
        return frozenset().union(*(s.item_fields() for s in self.scorers))

    def _inline(self) -> list[Scorer]:
        """The components this composite built and owns (not the hosted scorers it names)."""
        return [s for c, s in zip(self.components, self.scorers, strict=True) if not c.scorer]

    def lifecycle_weights(self) -> Any:
        """The inline components' device state (a reward model configured inside the composite)
        moves with the composite's own offload/onload; hosted scorers keep their own lifecycle."""
        from rewardplane.serve.weights import ManyWeights, weights_of

        return ManyWeights([weights_of(s) for s in self._inline()])

    def close(self) -> None:
        for s in self._inline():
            close = getattr(s, "close", None)
            if close is not None:
                close()

    def _component_results(self, items: list[ScoreItem]) -> list[list[float | ItemError]]:
        def run(scorer: Any, inline: bool) -> list[float | ItemError]:
            batch = [scorer.warmup_item() if it is self._warmup else it for it in items]
            try:
                # an inline component admits the items by its own contract; a hosted one's
                # queue does that for it
                values = admitted(scorer, batch, scorer.score_batch) if inline else scorer.score_batch(batch)
            except Exception as exc:
                err = ItemError("scorer_failed", f"raised {type(exc).__name__}: {str(exc)[:200]}")
                return [err] * len(items)
            if len(values) != len(items):
                return [
                    ItemError("scorer_failed", f"returned {len(values)} values for {len(items)} items")
                ] * len(items)
            return [_checked(v) for v in values]

        inline = [not c.scorer for c in self.components]
        return list(self._pool.map(run, self.scorers, inline))

    def _counted(
        self, failed: list[tuple[Component, Any, ItemError]]
    ) -> tuple[list[tuple[Component, float]], dict[str, ItemError], dict[str, ItemError]] | ItemError:
        """Under `on_failure: renormalize`: a service failure is left out; an item's own failure
        counts as the component's lowest score (`floor`, else the kind's `lowest_score`), so a
        failure the policy chose never scores above an honest wrong answer; with no lowest
        score, or a `required` component failed, the item fails with that error."""
        floored: list[tuple[Component, float]] = []
        left_out: dict[str, ItemError] = {}
        floored_errors: dict[str, ItemError] = {}
        for c, scorer, e in failed:
            error = ItemError(e.code, f"component {c.name!r} failed: {e.message}")
            if c.required:
                return error
            if failure_kind(e.code) == "service":
                left_out[c.name] = e
                continue
            floor = c.floor if c.floor is not None else getattr(scorer, "lowest_score", None)
            if floor is None:
                return error
            floored.append((c, float(floor)))
            floored_errors[c.name] = e
        return floored, left_out, floored_errors

    def _aggregate(self, values: list[float | ItemError]) -> CompositeScore | ItemError:
        triples = list(zip(self.components, self.scorers, values, strict=True))
        ok = [(c, float(v)) for c, _, v in triples if not isinstance(v, ItemError)]
        failed = [(c, s, v) for c, s, v in triples if isinstance(v, ItemError)]
        left_out: dict[str, ItemError] = {}
        floored: dict[str, ItemError] = {}
        if failed:
            first_c, _, first_e = failed[0]
            if self.options.on_failure == "fail":
                return ItemError(first_e.code, f"component {first_c.name!r} failed: {first_e.message}")
            counted = self._counted(failed)
            if isinstance(counted, ItemError):
                return counted
            at_floor, left_out, floored = counted
            ok = [*ok, *at_floor]
            if not ok:
                return ItemError(first_e.code, f"component {first_c.name!r} failed: {first_e.message}")
        in_order = {c.name: i for i, c in enumerate(self.components)}
        ok.sort(key=lambda cv: in_order[cv[0].name])
        agg = self.options.aggregation
        if agg == "min":
            value = min(v for _, v in ok)
        elif agg == "max":
            value = max(v for _, v in ok)
        elif agg == "mean":
            value = sum(c.weight * v for c, v in ok) / sum(c.weight for c, _ in ok)
        else:
            value = sum(c.weight * v for c, v in ok)
            if left_out:
                w_ok = sum(c.weight for c, _ in ok)
                if w_ok == 0:
                    code = next(iter(left_out.values())).code
                    return ItemError(code, "the components left have zero total weight")
                value *= sum(c.weight for c in self.components) / w_ok
        for name in left_out:
            self.left_out_counts[name] += 1
        return CompositeScore(value, {c.name: v for c, v in ok}, left_out, floored)

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        per_component = self._component_results(items)
        out: list[Any] = [self._aggregate([col[i] for col in per_component]) for i in range(len(items))]
        o = self.options
        if not o.group_normalize:
            return out
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            if item is self._warmup:
                continue
            if not item.group_id:
                out[i] = ItemError("bad_input", "group_normalize needs the item's group_id")
                continue
            groups.setdefault(item.group_id, []).append(i)
        for gid, idx in groups.items():
            failed = [items[i].id for i in idx if isinstance(out[i], ItemError)]
            if len(idx) != o.group_size:
                reason = f"group {gid!r} has {len(idx)} of its {o.group_size} items in this batch"
            elif failed:
                reason = f"item(s) {failed[:5]} of group {gid!r} failed"
            else:
                values = group_normalize([float(out[i]) for i in idx], scale=o.group_scale, ddof=o.std_ddof)
                for i, v in zip(idx, values, strict=True):
                    out[i] = out[i].with_value(v)
                continue
            for i in idx:
                if not isinstance(out[i], ItemError):
                    out[i] = ItemError("group_incomplete", reason)
        return out

    def warmup_item(self) -> ScoreItem:
        return self._warmup

    def _component_infos(self) -> list[dict[str, Any]]:
        comps = []
        for c, s in zip(self.components, self.scorers or [None] * len(self.components), strict=True):
            entry: dict[str, Any] = {"name": c.name, "weight": c.weight}
            entry.update({"scorer": c.scorer} if c.scorer else {"kind": c.kind})
            if c.required:
                entry["required"] = True
            if s is not None:
                ci = s.info()
                entry["identity"] = ci.identity
                if ci.extra:
                    entry["extra"] = ci.extra
            comps.append(entry)
        return comps

    def identity_config(self) -> dict[str, Any]:
        return {"components": [(c["name"], c.get("identity", "")) for c in self._component_infos()]}

    def info_extra(self) -> dict[str, Any]:
        return {
            "backend": "in-process components",
            "components": self._component_infos(),
            "left_out_counts": dict(self.left_out_counts),
        }
