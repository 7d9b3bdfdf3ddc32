"""One CUDA stream per scorer in a multi-scorer (consolidated) worker.

Why: every scorer thread in one process otherwise issues its work on the same default stream,
and a host→device copy from pageable memory (token ids, the normalisation constants, a gather
index: a few per batch) synchronises the whole stream it is issued on. So in a consolidated
worker each scorer's next batch waited for the other scorer's entire queued forward before it
could even start, and the GPU idled while it then prepared and launched (the measured gap
between consolidated and shared: docs/benchmarks/qualification-h200.md, "Both towers shared one
CUDA stream"). On its own stream a scorer only ever waits for itself, and the two towers'
kernels may overlap, as they do under MPS.

The kernels are the same, so scores are unchanged. Nothing changes on CPU.
"""

from __future__ import annotations

from typing import Any

from rewardplane.serve.protocol import ScoreItem, ScorerInfo
from rewardplane.serve.scorers.base import Scorer


class OwnStream(Scorer):
    """Wraps a scorer so `score_batch` (and the warm-up) run on a CUDA stream of its own."""

    def __init__(self, inner: Scorer) -> None:
        super().__init__(inner.name, max_batch_size=inner.max_batch_size, max_wait_ms=inner.max_wait_ms)
        self.inner = inner
        self.kind = inner.kind
        self.modality = inner.modality
        self.reads = inner.reads  # the admission contract is the wrapped scorer's
        self.lowest_score = inner.lowest_score  # what a composite floors an item failure at
        self.stream: Any = None

    def load(self) -> None:
        self.inner.load()
        device = str(getattr(self.inner, "device", "cpu"))
        if device.startswith("cuda"):
            import torch

            self.stream = torch.cuda.Stream(device=device)

    def score_batch(self, items: list[ScoreItem]) -> list[Any]:
        if self.stream is None:
            return self.inner.score_batch(items)
        import torch

        with torch.cuda.stream(self.stream):
            return self.inner.score_batch(items)

    def prepare(self, item: ScoreItem) -> Any:
        """The wrapped scorer's admission work (tokenising, image checks), unchanged."""
        return self.inner.prepare(item)

    def prepared_tokens(self, prepared: Any) -> int | None:
        return self.inner.prepared_tokens(prepared)

    def score_prepared(self, batch: list[Any]) -> list[Any]:
        if self.stream is None:
            return self.inner.score_prepared(batch)
        import torch

        with torch.cuda.stream(self.stream):
            return self.inner.score_prepared(batch)

    def hosted_references(self) -> tuple[str, ...]:
        return self.inner.hosted_references()

    def bind_hosted(self, hosted: dict[str, Any]) -> None:
        self.inner.bind_hosted(hosted)

    @property
    def empty_response(self) -> str | float:
        return self.inner.empty_response

    @property
    def groups_in_one_batch(self) -> bool:  # type: ignore[override]
        return self.inner.groups_in_one_batch

    @property
    def packs_tokens(self) -> bool:  # type: ignore[override]
        return self.inner.packs_tokens

    @property
    def concurrent_batches(self) -> int:  # type: ignore[override]
        return self.inner.concurrent_batches

    @property
    def queues_on_device(self) -> bool:  # type: ignore[override]
        return self.inner.queues_on_device

    def take_batch_stats(self) -> dict[str, int]:
        return self.inner.take_batch_stats()

    def info(self) -> ScorerInfo:
        return self.inner.info()

    def item_fields(self) -> frozenset[str]:
        return self.inner.item_fields()

    def warmup_item(self) -> ScoreItem:
        return self.inner.warmup_item()

    def item_tokens(self, item: ScoreItem) -> int | None:
        return self.inner.item_tokens(item)
