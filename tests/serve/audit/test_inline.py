"""A hosted text rule audits inline: scored in the thread that records the batch, under the
admission every request's items pass, with a failing item failing alone; a model auditor (or
any other) still goes through the backend."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.stream import AuditStream
from rewardplane.serve.backend import InProcessBackend
from rewardplane.serve.batcher import DynamicBatcher
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.rules import LengthScorer
from support import serve as _registers_double  # noqa: F401  (the test scorer kind "double")


class _Touchy(LengthScorer):
    """A length rule that raises on one response: in a batch call and alone."""

    kind: ClassVar[str] = "test_touchy_rule"

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        if any(i.response == "boom" for i in items):
            raise ValueError("boom")
        return super().score_batch(items)


def _items(responses: list[str | None]) -> list[ScoreItem]:
    return [ScoreItem(str(i), "p", r, metadata={"policy_version": 0}) for i, r in enumerate(responses)]


def test_score_inline_admits_prepares_and_fails_an_item_alone():
    batcher = DynamicBatcher(_Touchy("t", {}), max_batch_size=8, max_wait_ms=1, max_queue=64)
    out = batcher.score_inline(_items(["abc", None, "boom", "hello"]))
    assert out[0] == 3.0 and out[3] == 5.0
    assert isinstance(out[1], ItemError) and out[1].code == "bad_input"  # no response: admission's
    assert isinstance(out[2], ItemError) and out[2].code == "scorer_failed"  # its batch-mates scored


def test_a_hosted_rule_auditor_bypasses_its_queue_and_a_model_like_one_does_not(monkeypatch):
    config = config_from_dict({"scorers": [
        {"name": "rm", "kind": "regex", "options": {"pattern": "a"}},
        {"name": "gold", "kind": "length", "options": {"unit": "words"}},
        {"name": "echo", "kind": "double"},
    ]})  # fmt: skip
    submitted: list[str] = []
    real_submit = DynamicBatcher.submit

    async def counted(self, items):
        submitted.append(self.name)
        return await real_submit(self, items)

    monkeypatch.setattr(DynamicBatcher, "submit", counted)

    async def go() -> AuditStream:
        backend = InProcessBackend(config)
        await backend.start()
        assert backend.inline_scorer("gold") is not None and backend.inline_scorer("echo") is None
        audit = AuditConfig(proxy="rm", auditors=["gold", "echo"], sample=1.0, batch_wait_s=0)
        stream = AuditStream(audit, backend)
        await stream.start()
        submitted.clear()
        items = _items(["one two three", "four five", ""])
        stream.observe(["rm"], items, {"rm": [1.0, 0.0, 1.0]})
        await stream.drain()
        await stream.stop()
        await backend.stop()
        return stream

    stream = asyncio.run(go())
    assert "gold" not in submitted and "echo" in submitted  # the rule inline, the other queued
    assert stream.counts["audited"] == 3 and stream.auditor_errors == {"gold": 0, "echo": 0}
    (version,) = stream.ledger.snapshot_versions()
    assert version["auditors"]["gold"]["mean"] == (3 + 2 + 0) / 3


def test_a_rule_that_is_not_resident_is_scored_through_the_backend_which_refuses_it():
    config = config_from_dict({"scorers": [{"name": "rm", "kind": "regex", "options": {"pattern": "a"}},
                                           {"name": "gold", "kind": "length"}]})  # fmt: skip

    async def go() -> tuple[object, object]:
        backend = InProcessBackend(config)
        await backend.start()
        resident = backend.inline_scorer("gold")
        await backend.lifecycle.drain(["gold"], timeout_s=5)
        drained = backend.inline_scorer("gold")
        await backend.stop()
        return resident, drained

    resident, drained = asyncio.run(go())
    assert resident is not None and drained is None
