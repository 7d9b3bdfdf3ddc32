"""Typed scorer options: one loader, dotted keys everywhere a spec is read, defaults that round-trip,
`GET /v1/scorers`, the identity, and docs/serve.md's tables generated from the same models."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import yaml

from rewardplane.core.config import parse
from rewardplane.core.errors import ConfigError
from rewardplane.deploy.config import parse_deploy_config
from rewardplane.deploy.launch import service_config
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.protocol import ScoreItem
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.composite import Component
from rewardplane.serve.scorers.math import MathScorer
from rewardplane.serve.scorers.options import ScorerOptions, options_table
from rewardplane.serve.scorers.registry import BUILTIN_SCORERS, register_scorer, scorer_class
from support.deploy_fakes import CPU
from support.serve import LiveServer, make_config

DOCS = Path(__file__).resolve().parents[3] / "docs" / "serve.md"
REQUIRED: dict[str, dict[str, Any]] = {
    "regex": {"pattern": "x"},
    "judge": {"url": "http://127.0.0.1:9", "model": "m"},
    "composite": {"components": [{"name": "len", "kind": "length"}]},
}
"""The least each kind needs; every other kind's options are all optional."""


def message(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    return str(info.value)


def test_a_top_level_scorers_option_error_names_the_dotted_key():
    scorers = [{"name": "len", "kind": "length"}, {"name": "m", "kind": "math", "options": {"timeout_s": 0}}]
    assert message({"scorers": scorers}) == "scorers[1].options.timeout_s must be >= 0.001, got 0"
    scorers[1]["options"] = {"timeout_s": "soon"}
    assert message({"scorers": scorers}) == "scorers[1].options.timeout_s: expected float, got 'soon'"
    judge = {"name": "j", "kind": "judge", "options": {"model": "m"}}
    assert message({"scorers": [judge]}) == "scorers[0].options.url must be set with backend openai"


def test_a_deploy_file_scorers_option_error_names_the_dotted_key():
    doc = {
        "mode": "shared",
        "scorers": [
            {"name": "len", "kind": "length", "num_replicas": 1},
            {"name": "code", "kind": "code", "options": {"backend": "sandbox_fusion"}},
        ],
    }
    with pytest.raises(ConfigError) as info:
        service_config(parse_deploy_config(doc, CPU))  # what `serve --deploy` checks before any worker
    assert str(info.value) == "scorers[1].options.url must be set with backend sandbox_fusion"


def test_a_composite_components_option_error_names_the_dotted_key():
    comp = {
        "name": "reward",
        "kind": "composite",
        "options": {
            "components": [{"name": "ok", "kind": "length"}, {"name": "re", "kind": "regex", "options": {}}]
        },
    }
    got = message({"scorers": [{"name": "len", "kind": "length"}, comp]})
    assert got == "scorers[1].options.components[1].options.pattern: required key is missing"
    comp["options"]["components"][1] = {"name": "l", "kind": "length", "options": {"unit": "lines"}}
    got = message({"scorers": [comp]})
    assert got == "scorers[0].options.components[1].options.unit: 'lines' is not one of 'chars' or 'words'"


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (
            {"name": "m", "kind": "math", "options": {"timeout": 3}},
            "unknown config key scorers[0].options.timeout (did you mean scorers[0].options.timeout_s?); "
            "scorers[0].options has unknown keys ['timeout']",
        ),
        (
            {"name": "r", "kind": "regex", "options": {"patern": "x"}},  # the typo, not "pattern is missing"
            "unknown config key scorers[0].options.patern (did you mean scorers[0].options.pattern?)",
        ),
        (
            {
                "name": "c",
                "kind": "composite",
                "options": {"components": [{"name": "a", "kind": "length", "wieght": 2}]},
            },
            "unknown config key scorers[0].options.components[0].wieght (did you mean "
            "scorers[0].options.components[0].weight?)",
        ),
        (
            {"name": "r", "kind": "rm", "shape": "tiny-text-rm", "options": {"trust_remote_code": True}},
            "unknown config key scorers[0].options.trust_remote_code",  # rm never ran remote code
        ),
    ],
)
def test_unknown_option_keys_are_refused_with_the_nearest_valid_name(spec, want):
    assert message({"scorers": [spec]}).startswith(want)


@pytest.mark.parametrize("kind", sorted(BUILTIN_SCORERS))
def test_every_built_in_kinds_options_round_trip_their_defaults(kind):
    model = scorer_class(kind).Options
    given = REQUIRED.get(kind, {})
    options = parse(model, given)
    for name, field in model.model_fields.items():
        if name not in given:
            default = field.default_factory() if field.default_factory else field.default
            assert getattr(options, name) == default, name
    in_effect = options.in_effect()
    assert set(in_effect) == set(model.model_fields)
    assert parse(model, yaml.safe_load(yaml.safe_dump(in_effect))) == options  # as a config file says it
    spec = config_from_dict(
        {"scorers": [{"name": "s", "kind": kind, "shape": _shape(kind), "options": given}]}
    )
    assert spec.scorers[0].options == options and type(spec.scorers[0].options) is model


def _shape(kind: str) -> str | None:
    return {
        "clip": "tiny-clip",
        "pickscore": "tiny-clip",
        "rm": "tiny-text-rm",
        "hf_seqcls": "tiny-text-rm",
    }.get(kind)


def test_scorers_receive_typed_frozen_options():
    (spec,) = config_from_dict(
        {"scorers": [{"name": "m", "kind": "math", "options": {"workers": 2}}]}
    ).scorers
    scorer = scorer_class("math").from_spec(spec)
    assert scorer.options is spec.options and scorer.options.workers == 2 and scorer.workers == 2
    with pytest.raises(ConfigError, match="frozen"):
        scorer.options.workers = 3


def test_the_identity_holds_the_options_that_change_a_score():
    base = MathScorer("m").info().identity
    assert MathScorer("m", {"workers": 3, "timeout_s": 9.0}).info().identity == base  # how, not what
    assert MathScorer("m", {"extraction": "boxed"}).info().identity != base
    assert MathScorer("m", {"extraction": "auto"}).info().identity == base  # a default said aloud


def test_v1_scorers_shows_options_in_effect_and_each_kinds_schema():
    comp = {"components": [{"name": "len", "kind": "length", "options": {"unit": "words"}}]}
    cfg = make_config(
        [
            {"name": "re", "kind": "regex", "options": {"pattern": "^a"}},
            {"name": "c", "kind": "composite", "options": comp},
        ]
    )
    with LiveServer(cfg) as server:
        body = httpx.get(server.url + "/v1/scorers", timeout=30).json()
    by_name = {s["name"]: s for s in body["scorers"]}
    assert by_name["re"]["options"] == {
        "deadline_s": 1.0,
        "pattern": "^a",
        "mode": "search",
        "flags": [],
        "examples": [],
    }
    component = by_name["c"]["options"]["components"][0]
    assert component["options"] == {"deadline_s": 1.0, "unit": "words"} and component["weight"] == 1.0
    assert set(body["kinds"]) == {"regex", "composite", "length"}
    schema = {o["name"]: o for o in body["kinds"]["regex"]}
    pattern, mode = schema["pattern"], schema["mode"]
    assert pattern == {
        "name": "pattern",
        "type": "str",
        "required": True,
        "description": "The regular expression (Python `re` syntax, run by RE2 in linear time: no "
        "backreferences or lookaround) the response must match for 1.0.",
        "identity": True,
    }
    assert schema["deadline_s"]["identity"] is False and schema["examples"]["identity"] is False
    assert mode["default"] == "search" and mode["type"] == '"search" | "fullmatch"' and not mode["required"]


class _Bare(Scorer):
    kind: ClassVar[str] = "rk_test_bare"
    modality: ClassVar = "rule"

    def load(self) -> None:
        pass

    def score_batch(self, items: list[ScoreItem]) -> list[float]:
        return [1.0] * len(items)


class _TypedOptions(ScorerOptions):
    factor: float = 1.0
    """What every score is."""


class _Typed(_Bare):
    kind: ClassVar[str] = "rk_test_typed"
    Options = _TypedOptions

    def score_batch(self, items: list[ScoreItem]) -> list[float]:
        return [self.options.factor] * len(items)


register_scorer(_Bare.kind, _Bare)
register_scorer(_Typed.kind, _Typed)


def test_a_third_party_kind_without_an_options_model_takes_no_options():
    assert message({"scorers": [{"name": "b", "kind": "rk_test_bare", "options": {"factor": 2}}]}).startswith(
        "unknown config key scorers[0].options.factor; scorers[0].options has unknown keys ['factor']"
    )
    (spec,) = config_from_dict(
        {"scorers": [{"name": "t", "kind": "rk_test_typed", "options": {"factor": 2}}]}
    ).scorers
    typed = scorer_class(spec.kind).from_spec(spec)
    assert typed.score_batch([ScoreItem("a", "", "")]) == [2.0]
    assert typed.info().options == {"factor": 2.0}


def test_reading_a_config_imports_no_torch():
    """The gateway and the HTTP frontend parse every scorer's options without loading a model
    library: scorer modules keep torch and transformers out of import time."""
    code = (
        "import sys\n"
        "from rewardplane.serve.config import config_from_dict\n"
        "kinds = [{'name': k, 'kind': k, 'shape': s} for k, s in "
        "[('rm', 'tiny-text-rm'), ('hf_seqcls', 'tiny-text-rm'), ('clip', 'tiny-clip'), ('pickscore', 'tiny-clip')]]\n"
        "kinds += [{'name': k, 'kind': k} for k in ('math', 'code', 'length', 'exact_match')]\n"
        "config_from_dict({'scorers': kinds})\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'a model library was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


TABLES = {kind: scorer_class(kind).Options for kind in BUILTIN_SCORERS} | {"composite.components": Component}


def _documented(text: str, key: str) -> str:
    found = re.search(
        rf"<!-- options:{re.escape(key)} -->\n(.*?)<!-- /options:{re.escape(key)} -->", text, re.S
    )
    assert found, f"docs/serve.md has no table for {key} (<!-- options:{key} --> ... <!-- /options:{key} -->)"
    return found.group(1).strip()


def test_docs_show_each_kinds_options_as_the_models_declare_them():
    text = DOCS.read_text(encoding="utf-8")
    if os.environ.get("REWARDPLANE_UPDATE_DOCS") == "1":
        for key, model in TABLES.items():
            start, end = f"<!-- options:{key} -->\n", f"<!-- /options:{key} -->"
            head, rest = text.split(start)
            text = head + start + options_table(model) + "\n" + end + rest.split(end, 1)[1]
        DOCS.write_text(text, encoding="utf-8")
    for key, model in TABLES.items():
        assert _documented(text, key) == options_table(model), (
            f"docs/serve.md's {key} table differs from its options model; "
            "REWARDPLANE_UPDATE_DOCS=1 pytest tests/serve/scorers/test_options.py rewrites it"
        )
    assert all(o.description for model in TABLES.values() for o in _fields(model)), (
        "an option without a meaning"
    )


def _fields(model: Any) -> list[Any]:
    return list(model.model_fields.values())
