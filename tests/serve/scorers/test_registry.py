"""Scorer kinds are one table (`serve/scorers/registry.py`'s `BUILTIN_SCORERS`): a new kind is its
module and its line there (docs/architecture.md, "where does X go"), and everything else — the
config loader, `GET /v1/scorers` with its options and `reads`, admission, the verl adapter's
question "does this scorer need the prompt?" — follows from those two places."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from rewardplane.core.errors import ConfigError, UsageError
from rewardplane.integrations import verl
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.scorers.registry import BUILTIN_SCORERS, build_scorer, scorer_class
from support.serve import LiveServer

ROOT = Path(__file__).resolve().parents[3]

TOY_MODULE = '''
from typing import ClassVar

from rewardplane.serve.admission import RESPONSE
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.options import ScorerOptions


class ToyOptions(ScorerOptions):
    scale: float = 1.0
    """Multiplies the response's length."""


class ToyScorer(Scorer):
    kind: ClassVar[str] = "toy"
    modality: ClassVar = "rule"
    Options = ToyOptions
    reads: ClassVar[frozenset[str]] = frozenset({RESPONSE})

    def load(self) -> None:
        pass

    def score_batch(self, items):
        return [self.options.scale * len(item.response) for item in items]
'''


@pytest.fixture
def toy_kind(tmp_path, monkeypatch):
    """The two places: the kind's module (here a file on sys.path) and its line in the registry."""
    (tmp_path / "toy_kind.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(BUILTIN_SCORERS, "toy", "toy_kind:ToyScorer")
    yield "toy"
    sys.modules.pop("toy_kind", None)


def test_a_new_kind_is_its_module_and_its_registry_line(toy_kind, monkeypatch):
    spec = {"name": "t", "kind": toy_kind, "options": {"scale": 2}}
    config = config_from_dict({"scorers": [spec]})
    with pytest.raises(
        ConfigError, match=r"scorers\[0\]\.options\.scal \(did you mean scorers\[0\]\.options\.scale\?\)"
    ):
        config_from_dict({"scorers": [{**spec, "options": {"scal": 2}}]})
    scorer = build_scorer(config.scorers[0])
    scorer.load()
    assert scorer.info().reads == ("response",)
    with LiveServer(config) as server:
        (listed,) = httpx.get(server.url + "/v1/scorers").json()["scorers"]
        assert (listed["kind"], listed["reads"], listed["options"]) == ("toy", ["response"], {"scale": 2.0})
        kinds = httpx.get(server.url + "/v1/scorers").json()["kinds"]
        assert [o["name"] for o in kinds["toy"]] == ["scale"]
        missing = {"scorers": ["t"], "items": [{"id": "a", "prompt": "p"}]}  # admission reads `reads`
        r = httpx.post(server.url + "/v1/score", json=missing).json()["results"][0]
        assert r["errors"]["t"]["code"] == "bad_input"
        # verl passes only the response: the service says this kind does not read the prompt
        monkeypatch.setenv("REWARDPLANE_URL", server.url)
        assert verl.compute_score("src", "abcd", None, {}, scorer="t") == 8.0


def test_built_in_kinds_are_listed_once():
    """pyproject's `rewardplane.scorers` entry points are for other packages' kinds; the
    built-ins are `BUILTIN_SCORERS` alone, each resolving to its class."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project.get("entry-points", {}).get("rewardplane.scorers", {})
    assert not [k for k, v in listed.items() if v.startswith("rewardplane.")], listed
    for kind, target in BUILTIN_SCORERS.items():
        assert scorer_class(kind).kind == kind, target


def test_verl_asks_the_service_what_a_scorer_reads():
    """No copy of the kinds that need no prompt in the adapter: a scorer that reads the prompt
    without one is a UsageError, one that does not is sent an empty prompt."""
    assert not hasattr(verl, "PROMPTLESS_KINDS")
    assert verl._prompt({}, ("length", False), "len") == ""
    with pytest.raises(UsageError, match="scores the prompt too"):
        verl._prompt({}, ("rm", True), "rm")


def test_a_composite_publishes_what_its_components_read():
    config = config_from_dict(
        {
            "scorers": [
                {"name": "ex", "kind": "exact_match"},
                {
                    "name": "mix",
                    "kind": "composite",
                    "options": {
                        "components": [{"name": "len", "kind": "length"}, {"name": "ex", "scorer": "ex"}]
                    },
                },
            ]
        }
    )
    with LiveServer(config) as server:
        listed = {s["name"]: s["reads"] for s in httpx.get(server.url + "/v1/scorers").json()["scorers"]}
    assert listed == {"ex": ["reference", "response"], "mix": ["reference", "response"]}
