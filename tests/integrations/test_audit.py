"""The audit in the trainer: `AuditCallback` in TRL 1.16's own `GRPOTrainer` loop (a tiny
policy on CPU) against a live server whose audit has an alarm to raise; and the flat metric
dict for verl's and OpenRLHF's loggers."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import httpx
import pytest

pytest.importorskip("trl")

from datasets import Dataset
from trl import GRPOTrainer

from rewardplane.core.errors import UsageError
from rewardplane.integrations.audit import AuditCallback, audit_metrics
from rewardplane.integrations.trl import RemoteReward
from rewardplane.serve.scorers.base import ScoreItem, Scorer, ScorerInfo
from rewardplane.serve.scorers.common import as_text
from rewardplane.serve.scorers.registry import register_scorer
from support.serve import LiveServer, make_config
from support.trl_policy import grpo_args, tiny_policy

PROMPTS = ["Say hello.", "Two plus two?", "Name a colour.", "Hi there."]


class NegatedLength(Scorer):
    """An auditor that ranks every completion exactly against the `length` proxy."""

    kind: ClassVar[str] = "negated_length"
    modality: ClassVar = "text"

    def load(self) -> None:
        pass

    def score_batch(self, items: list[ScoreItem]) -> list[float]:
        return [-float(len(as_text(i.response))) for i in items]

    def info(self) -> ScorerInfo:
        return ScorerInfo(self.name, self.kind, self.modality, "none", "cpu", "test", "neg", 64, 1.0)


register_scorer("negated_length", NegatedLength)

AUDIT = {
    "proxy": "len", "auditors": ["neg"], "sample": 1.0, "min_items": 3, "batch_wait_s": 0, "settle_versions": 1,
    # one bin decides: the proxy ranks every completion against the auditor from the first step
    # (a loose level: a handful of items a step bound the covariance's size only loosely)
    "alarms": {"decorrelation": {"window": 1, "alpha": 0.3}, "overoptimization": {"enabled": False}},
}  # fmt: skip


@pytest.fixture
def audited():  # a fresh server per test: an alarm fired in one run must not carry into the next
    config = make_config(
        [{"name": "len", "kind": "length"}, {"name": "neg", "kind": "negated_length"}], audit=AUDIT
    )
    with LiveServer(config) as live:
        yield live


def train(url: str, tmp_path, callback: AuditCallback, max_steps: int) -> GRPOTrainer:
    model, tokenizer = tiny_policy()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[RemoteReward(url, scorer="len", audit=callback)],
        args=grpo_args(tmp_path, tokenizer, max_steps=max_steps),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    trainer.train()
    return trainer


def audit_body(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/audit").json()


def test_the_callback_logs_audit_metrics_and_steps_are_the_policy_versions(audited, tmp_path):
    callback = AuditCallback(audited.url, on_alarm="log")
    trainer = train(audited.url, tmp_path, callback, max_steps=4)
    assert trainer.state.global_step == 4 and callback.stopped_by is None
    versions = [v["version"] for v in audit_body(audited.url)["versions"]]
    assert versions == [0, 1, 2, 3]  # one version per step: TRL's trainer_state.global_step
    logged = [row for row in trainer.state.log_history if "audit/neg/tau" in row]
    assert logged, trainer.state.log_history  # through TRL's log_metric, next to its own metrics
    assert logged[-1]["audit/neg/tau"] == pytest.approx(-1.0)
    assert logged[-1]["audit/alarm/decorrelation"] == 1.0 and "rewards/rewardplane_len/mean" in logged[-1]


def test_on_alarm_stop_ends_training_at_the_step_that_sees_it(audited, tmp_path):
    callback = AuditCallback(audited.url, on_alarm="stop", stop_on=("decorrelation",))
    trainer = train(audited.url, tmp_path, callback, max_steps=8)
    assert callback.stopped_by == [("decorrelation", "neg")]
    assert trainer.state.global_step < 8


def test_an_unreachable_or_unaudited_service_is_a_warning_not_a_failure(tmp_path, caplog):
    with LiveServer(make_config([{"name": "len", "kind": "length"}])) as plain:
        callback = AuditCallback(plain.url, on_alarm="stop")
        trainer = train(plain.url, tmp_path, callback, max_steps=2)
    assert trainer.state.global_step == 2 and callback.metrics == {"audit/available": 0.0}
    assert sum("cannot read" in r.message for r in caplog.records) == 1


def test_audit_metrics_is_the_flat_dict_verl_and_openrlhf_log(audited):
    for version in (0, 1):
        items = [{"id": str(i), "prompt": "p", "response": "x" * (i + 1), "metadata": {"policy_version": version}}
                 for i in range(5)]  # fmt: skip
        httpx.post(f"{audited.url}/v1/score", json={"scorers": ["len"], "items": items}).raise_for_status()
    deadline = time.monotonic() + 120
    while not audit_body(audited.url)["bins"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    metrics = audit_metrics(audited.url)
    # the first bin (version 0: responses of 1..5 characters) as the trainer logs it; the
    # auditor is the proxy negated, so it ranks every item exactly against it
    signatures = {k: v for k, v in metrics.items() if k.startswith("audit/signature/")}
    assert signatures and set(signatures.values()) == {0.0}
    audited_items = metrics.pop("audit/audited")
    assert 5 <= audited_items <= 10  # version 1's items may still be on their way through the auditor
    assert {k: v for k, v in metrics.items() if k not in signatures} == {
        "audit/dropped_frac": 0.0,
        "audit/version": 0.0,
        "audit/proxy_mean": 3.0,
        "audit/neg/mean": -3.0,
        "audit/neg/tau": -1.0,
        "audit/neg/tilt": pytest.approx(-1.0),
        "audit/epoch": 0.0,
        "audit/neg/gap": pytest.approx(0.0, abs=1e-9),
        "audit/alarm/decorrelation": 1.0,
        "audit/alarm/decorrelation/neg": 1.0,
    }


def test_bad_settings_are_usage_errors(audited):
    with pytest.raises(UsageError, match="on_alarm"):
        AuditCallback(audited.url, on_alarm="halt")
    with pytest.raises(UsageError, match="unknown alarms"):
        AuditCallback(audited.url, stop_on=("overfitting",))
