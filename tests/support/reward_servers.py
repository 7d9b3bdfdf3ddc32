"""The real rewardplane server (uvicorn on a loopback port) that the trainer-protocol tests drive:
tests/integrations (TRL, verl, OpenRLHF) and tests/serve/test_unirl.py (UniRL's protocol "1").
Each folder's conftest.py imports the fixtures it uses from here.

Scorers: `rm` (a random tiny text reward model, real tokenisation and forward), `len` (response
length in characters), `exact` (exact match against `reference`) and `double` (tests/support's
scorer that fails on demand: a response containing "NAN" is a `non_finite` item error), and `clip`
(a random tiny CLIP: caption + image). Three composites give components to the adapters:
`reward` (the hosted `rm` at weight 0.5 + the response length at 0.01), `guarded` (length +
`double` at 2.0: a "NAN" response fails the item) and `lenient` (the same, `on_failure:
renormalize`: a "NAN" response leaves `dbl` out).
"""

from __future__ import annotations

import pytest

from rewardplane.serve.client import RewardClient
from support.serve import LiveServer, make_config

SCORERS = [
    {"name": "rm", "kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu", "max_wait_ms": 2},
    {"name": "len", "kind": "length"},
    {"name": "exact", "kind": "exact_match"},
    {"name": "double", "kind": "double", "max_wait_ms": 1},
    {"name": "clip", "kind": "clip", "shape": "tiny-clip", "device": "cpu", "max_wait_ms": 2},
    {
        "name": "reward",
        "kind": "composite",
        "options": {
            "components": [
                {"name": "model", "scorer": "rm", "weight": 0.5},
                {"name": "length", "kind": "length", "weight": 0.01},
            ]
        },
    },
    *(
        {
            "name": name,
            "kind": "composite",
            "options": {
                "components": [
                    {"name": "len", "kind": "length"},
                    {"name": "dbl", "kind": "double", "weight": 2.0},
                ],
                "on_failure": policy,
            },
        }
        for name, policy in (("guarded", "fail"), ("lenient", "renormalize"))
    ),
]


@pytest.fixture(scope="package")
def server():
    with LiveServer(make_config(SCORERS)) as live:
        yield live


@pytest.fixture(scope="package")
def token_server():
    """A service that wants a bearer token ("tok")."""
    with LiveServer(make_config([{"name": "len", "kind": "length"}], token="tok")) as live:
        yield live


@pytest.fixture(scope="package")
def one_scorer_server():
    with LiveServer(make_config([{"name": "len", "kind": "length"}])) as live:
        yield live


def _direct_scores(url: str, scorer: str, items: list[dict]) -> list[float | None]:
    with RewardClient(url, allow_partial=True) as client:
        results = client.score(items, [scorer])
    return [r.scores.get(scorer) for r in results]


def _direct_components(url: str, scorer: str, items: list[dict]) -> list[dict[str, float]]:
    with RewardClient(url, allow_partial=True) as client:
        results = client.score(items, [scorer])
    return [r.details.get(scorer, {}).get("components", {}) for r in results]


@pytest.fixture
def direct_components():
    """`(url, composite, items) -> [{component: value}]`: each item's components as `POST /v1/score`
    answers them (`details[<composite>].components`)."""
    return _direct_components


@pytest.fixture
def direct_scores():
    """`(url, scorer, items) -> [score | None]`: the items through `POST /v1/score` with rewardplane's
    own client, the reference every adapter is compared with."""
    return _direct_scores
