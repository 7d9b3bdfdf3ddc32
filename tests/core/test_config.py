"""The one config loader: YAML + overrides, strict types, unknown keys with a hint, dtype spellings."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field, field_validator

from rewardplane.core.config import (
    ConfigModel,
    Dtype,
    apply_overrides,
    canonical_dtype,
    dump_yaml,
    load,
    parse,
    read_yaml,
    to_dict,
)
from rewardplane.core.errors import ConfigError


class Run(ConfigModel):
    max_steps: int = 100
    lr: float = 1e-4
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.999])
    layout: Literal["right", "packed"] = "packed"
    dtype: Dtype = "fp32"
    repeats: int = Field(1, ge=1)
    name: str = "run"

    @field_validator("name")
    @classmethod
    def _no_slash(cls, value: str) -> str:
        if "/" in value:
            raise ValueError("must not contain '/'")
        return value


class Top(ConfigModel):
    run: Run = Field(default_factory=Run)
    items: list[Run] = Field(default_factory=list)
    flag: bool = False


def test_yaml_file_and_dotted_overrides(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("run: {max_steps: 5, lr: 1.0e-3}\n")
    cfg = load(Top, path, ["run.lr=1e-4", "run.layout=right", "flag=true", "items=[{max_steps: 2}]"])
    assert cfg.run.max_steps == 5 and cfg.run.lr == 1e-4 and cfg.run.layout == "right"
    assert cfg.flag is True and cfg.items[0].max_steps == 2 and cfg.items[0].lr == 1e-4
    assert load(Top, None).run == Run()  # no file: defaults
    again = tmp_path / "again.yaml"
    again.write_text(dump_yaml(cfg))
    assert load(Top, again) == cfg and to_dict(cfg)["run"]["layout"] == "right"


def test_overrides_parse_yaml_scalars_and_create_sections():
    data = apply_overrides(
        {"run": None}, ["run.max_steps=3", "a.b.c=null", "empty=", "run.betas=[0.8, 1e-3]"]
    )
    assert data == {"run": {"max_steps": 3, "betas": [0.8, "1e-3"]}, "a": {"b": {"c": None}}, "empty": ""}
    assert parse(Top, {"run": data["run"]}).run.betas == [0.8, 1e-3]  # YAML 1.1's "1e-3" is a float here
    with pytest.raises(ConfigError, match="not key=value"):
        apply_overrides({}, ["nonsense"])
    with pytest.raises(ConfigError, match="run is not a section"):
        apply_overrides({"run": 3}, ["run.max_steps=1"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["run.max_step=3"], "unknown config key run.max_step (did you mean run.max_steps?)"),
        (["items=[{layuot: right}]"], "unknown config key items[0].layuot (did you mean items[0].layout?)"),
        (["trainer=1"], "unknown config key trainer; the top level has unknown keys ['trainer']"),
        (["run.max_steps=many"], "run.max_steps: expected int, got 'many'"),
        (["run.max_steps=true"], "run.max_steps: expected int, got True"),
        (["run.lr=fast"], "run.lr: expected float, got 'fast'"),
        (["flag=nope"], "flag: expected bool, got 'nope'"),
        (["run.layout=diagonal"], "run.layout: 'diagonal' is not one of 'right' or 'packed'"),
        (["run.repeats=0"], "run.repeats must be >= 1, got 0"),
        (["run.name=a/b"], "run.name must not contain '/'"),
        (["run=5"], "run: expected a mapping, got 5"),
        (["run.dtype=fp8"], "run.dtype must be one of fp32, fp16, bf16"),
    ],
)
def test_errors_are_one_line_and_name_the_dotted_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load(Top, None, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert info.value.code == "config"


def test_several_problems_are_counted_on_one_line():
    with pytest.raises(ConfigError, match=r"^run.max_steps: expected int.*\(and 1 more problem\)$"):
        parse(Top, {"run": {"max_steps": "x", "lr": "y"}})


def test_where_prefixes_keys_and_non_mappings_are_refused():
    with pytest.raises(
        ConfigError, match=r"unknown config key plans\[2\].max_stepz \(did you mean plans\[2\]"
    ):
        parse(Run, {"max_stepz": 1}, where="plans[2]")
    with pytest.raises(ConfigError, match=r"plans\[2\] must be a mapping, got list"):
        parse(Run, [], where="plans[2]")


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("fp32", "fp32"),
        ("float32", "fp32"),
        ("float", "fp32"),
        ("fp16", "fp16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
    ],
)
def test_one_dtype_vocabulary(spelling, canonical):
    assert canonical_dtype(spelling) == canonical
    assert parse(Run, {"dtype": spelling}).dtype == canonical


def test_direct_construction_and_assignment_raise_config_error():
    with pytest.raises(ConfigError, match="repeats must be >= 1"):
        Run(repeats=0)
    run = Run()
    with pytest.raises(ConfigError, match="max_steps: expected int"):
        run.max_steps = "many"

    class Frozen(ConfigModel):
        model_config = {"frozen": True}
        x: int = 1

    with pytest.raises(ConfigError, match="frozen"):
        Frozen().x = 2
    assert Frozen().model_copy(update={"x": 2}).x == 2


def test_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        load(Top, bad)
    assert "\n" not in str(info.value)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load(Top, bad)
    (tmp_path / "empty.yaml").write_text("")
    assert load(Top, tmp_path / "empty.yaml") == Top()
