"""Service config: YAML loading, clear errors for every bad key, the scorer registry."""

from __future__ import annotations

import pytest

from rewardplane.core.errors import ConfigError
from rewardplane.serve.config import config_from_dict, load_config
from rewardplane.serve.scorers.registry import build_scorer, scorer_registry


def test_loads_yaml_with_defaults(tmp_path, monkeypatch):
    path = tmp_path / "service.yaml"
    path.write_text(
        "limits: {max_items: 10}\n"
        "scorers:\n"
        "  - {name: clip, kind: clip, shape: clip-vit-l-14, dtype: bf16, max_batch_size: 64}\n"
        "  - {name: re, kind: regex, options: {pattern: '^\\d+$', mode: fullmatch}}\n"
    )
    cfg = load_config(path)
    assert cfg.limits.max_items == 10 and cfg.limits.max_body_bytes == 32 * 1024 * 1024
    assert cfg.scorers[0].dtype == "bf16" and cfg.scorers[0].max_wait_ms == 5.0
    monkeypatch.setenv("REWARDPLANE_TOKEN", "from-env")
    assert cfg.resolved_token() == "from-env"
    monkeypatch.delenv("REWARDPLANE_TOKEN")
    assert cfg.resolved_token() is None
    scorer = build_scorer(cfg.scorers[1])
    assert scorer.score_batch(
        [__import__("rewardplane.serve.protocol", fromlist=["x"]).ScoreItem("a", "", "123")]
    ) == [1.0]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "must be a mapping"),
        ({"scorers": []}, "non-empty list"),
        ({"scorers": [{"name": "a", "kind": "nope"}]}, "unknown kind 'nope'"),
        ({"scorers": [{"name": "a", "kind": "length", "colour": 1}]}, "unknown keys ['colour']"),
        ({"scorers": [{"name": "a", "kind": "clip", "dtype": "fp8"}]}, "dtype must be one of"),
        ({"scorers": [{"name": "a", "kind": "clip", "path": "x", "shape": "y"}]}, "not both"),
        ({"scorers": [{"name": "a", "kind": "length", "max_batch_size": 0}]}, "max_batch_size"),
        (
            {"scorers": [{"name": "a", "kind": "length"}, {"name": "a", "kind": "exact_match"}]},
            "duplicate scorer names",
        ),
        ({"scorers": [{"kind": "length"}]}, "name"),
        ({"scorers": [{"name": "a", "kind": "length"}], "limits": {"max_items": -1}}, "limits.max_items"),
        ({"scorers": [{"name": "a", "kind": "length"}], "limtis": {}}, "unknown keys ['limtis']"),
        ({"scorers": [{"name": "a", "kind": "length"}], "prefetch_images": "no"}, "prefetch_images"),
    ],
)
def test_bad_configs_name_the_problem(raw, message):
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        config_from_dict(raw)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("scorers: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_registry_has_builtins_and_options_are_checked_when_the_config_is_read():
    assert {"rm", "hf_seqcls", "clip", "pickscore", "exact_match", "regex", "length"} <= set(
        scorer_registry()
    )
    for spec, message in (
        (
            {"name": "r", "kind": "regex", "options": {"pattern": "("}},
            "scorers[0].options.pattern: does not compile",
        ),
        (
            {"name": "c", "kind": "clip", "shape": "clip-vit-q-99"},
            "scorers[0].shape: unknown shape 'clip-vit-q-99'",
        ),
        ({"name": "c", "kind": "clip"}, "scorers[0].path: kind clip needs path"),
        (
            {"name": "l", "kind": "length", "options": {"unit": "lines"}},
            "scorers[0].options.unit: 'lines' is not one of",
        ),
    ):
        with pytest.raises(ConfigError) as info:
            config_from_dict({"scorers": [spec]})
        assert str(info.value).startswith(message), str(info.value)
