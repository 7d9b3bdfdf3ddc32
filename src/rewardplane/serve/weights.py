"""What moves when a scorer offloads or onloads: its device state (docs/lifecycle.md).

`weights_of(scorer)` picks one: `NoWeights` (rules: the states are real, nothing moves),
`ModelWeights` (a model's weights, through `rewardplane.models.offload.WeightOffloader`), a
scorer's own (`lifecycle_weights()`), or `ManyWeights` (several that move as one, all or
nothing). `rewardplane.serve.lifecycle`'s state machine moves them on the scorer's thread.
"""

from __future__ import annotations

import contextlib
from typing import Any


class NoWeights:
    """A scorer without device state (rules): the states are real, nothing moves."""

    def offload(self) -> dict[str, Any]:
        return {"bytes": 0}

    def onload(self) -> dict[str, Any]:
        return {"bytes": 0}

    def bytes_total(self) -> int:
        return 0

    def bytes_on_device(self) -> int:
        return 0


class ModelWeights:
    """A model scorer's weights (`scorer.model`), through `rewardplane.models.offload.WeightOffloader`.

    Hooks the scorer may define: `before_offload()` (drop what holds device addresses of the
    weights, such as CUDA graphs) and `after_onload()` (rebuild it). A scorer that holds CUDA
    graphs (`_graphs`) without these hooks is refused: its graphs would replay freed memory.
    """

    def __init__(self, scorer: Any, *, pin: str = "register") -> None:
        self.scorer = scorer
        self.pin = pin
        self._offloader: Any = None

    def _weights(self) -> Any:
        if self._offloader is None:
            from rewardplane.models.offload import WeightOffloader

            self._offloader = WeightOffloader(self.scorer.model, pin=self.pin)
        return self._offloader

    def offload(self) -> dict[str, Any]:
        before = getattr(self.scorer, "before_offload", None)
        if before is not None:
            before()
        elif getattr(self.scorer, "_graphs", None):
            raise RuntimeError("scorer holds CUDA graphs but has no before_offload/after_onload hooks")
        return self._weights().offload().as_dict()

    def onload(self) -> dict[str, Any]:
        weights = self._weights()
        transfer = weights.onload()
        after = getattr(self.scorer, "after_onload", None)
        if after is not None:
            try:
                after()
            except BaseException:
                before = getattr(self.scorer, "before_offload", None)
                if before is not None:
                    with contextlib.suppress(Exception):
                        before()
                weights.offload(copy=False)  # the host copy is current: nothing to copy back
                raise
        return transfer.as_dict()

    def bytes_total(self) -> int:
        return self._weights().nbytes

    def bytes_on_device(self) -> int:
        return self._weights().bytes_on_device


def _merged(transfers: list[dict[str, Any]]) -> dict[str, Any]:
    """Several transfers reported as one: byte, copy and time counts summed, rate recomputed."""
    out: dict[str, Any] = {}
    for t in transfers:
        for key, value in t.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and key != "gbps":
                out[key] = out.get(key, 0) + value
            else:
                out.setdefault(key, value)
    if out.get("copy_seconds"):
        out["gbps"] = round(out.get("bytes", 0) / out["copy_seconds"] / 1e9, 3)
    return out


class ManyWeights:
    """The device state of several scorers moving as one: a composite's inline components (a
    reward model configured inside it) offload and onload with the composite. All or nothing:
    a move that fails part-way puts the parts it already moved back, then raises, so the state
    the lifecycle reports stays true."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def _all(self, forward: str, back: str) -> dict[str, Any]:
        done: list[dict[str, Any]] = []
        for part in self.parts:
            try:
                done.append(getattr(part, forward)())
            except BaseException:
                for moved in reversed(self.parts[: len(done)]):
                    with contextlib.suppress(Exception):
                        getattr(moved, back)()
                raise
        return _merged(done) if done else {"bytes": 0}

    def offload(self) -> dict[str, Any]:
        return self._all("offload", "onload")

    def onload(self) -> dict[str, Any]:
        return self._all("onload", "offload")

    def bytes_total(self) -> int:
        return sum(p.bytes_total() for p in self.parts)

    def bytes_on_device(self) -> int:
        return sum(p.bytes_on_device() for p in self.parts)


def weights_of(scorer: Any) -> NoWeights | ModelWeights:
    """The device state a scorer carries. Wrappers (deploy's `OwnStream`) expose `inner`."""
    custom = getattr(scorer, "lifecycle_weights", None)
    if custom is not None:
        return custom()
    inner = getattr(scorer, "inner", None)
    if inner is not None:
        return weights_of(inner)
    model = getattr(scorer, "model", None)
    try:
        import torch

        if isinstance(model, torch.nn.Module):
            return ModelWeights(scorer)
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    return NoWeights()
