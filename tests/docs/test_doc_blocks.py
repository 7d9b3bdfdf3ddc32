"""Every YAML and command block of README.md and docs/*.md is checked (issue 47: a documented
config gave a silently wrong reward). Each block has a class in BLOCKS, keyed by its file and the
start of its first line; a new block without one fails `test_every_block_has_a_class`, and an
entry no block matches any more fails too. The classes:

- `tour`: run line by line by a test: the README tour by tests/cli/test_tour.py, the real-data
  tutorial by tests/cli/test_tutorial_real_data.py;
- `console`: `$ rewardplane ...` transcripts whose output tests/cli/test_docs_figures.py checks;
- `cli`: every `rewardplane ...` line (continuations joined) is parsed by the real parser: a
  concrete line must parse (commands, flags, choices, required options), a synopsis (`[...]`,
  `A|B`, `...`) must name only options the command has. Nothing runs: the data is not here;
- `service`, `audit`, `deploy`, `train_rm`, `train_dpo`, `qualify`: the YAML goes through the
  project's loader for that file (core/config.py); a service's rule-based scorers (`length`,
  `exact_match`, `regex`, `math`, a composite of those) are built and score one fitting item,
  whose expected value the entry states;
- `text`, with the reason: output, diagrams, another program's config, shell lines not ours.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from rewardplane.cli import build_parser
from support.docs import ROOT

FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("", "yaml", "bash", "console", "sh")
# (file, the start of the block's first line) -> (class, why / what it shows)
BLOCKS: dict[tuple[str, str], tuple[str, str]] = {
    ("README.md", "make demo   # build a preference set, trai"): ("text", "make targets (make demo runs in CI)"),
    ("README.md", "source .venv/bin/activate"): ("text", "shell set-up"),
    ("README.md", "rewardplane data synth --out tour/synth.j"): ("tour", ""),
    ("README.md", "rewardplane train rm --config src/rewardp"): ("tour", ""),
    ("README.md", "rewardplane train dpo --config src/rewardp"): ("tour", ""),
    ("README.md", "rewardplane eval --model tour/runs/rm/chec"): ("tour", ""),
    ("README.md", "rewardplane serve --config service.yaml  "): ("cli", "needs a service file and a server"),
    ("README.md", "scorers:   # pip install 'rewardplane[ser"): ("service", "verifiers"),
    ("README.md", "audit: {proxy: rm, auditors: [gold], samp"): ("audit", ""),
    ("README.md", "REWARDPLANE_TOKEN=... rewardplane bench -"): ("cli", "needs a running service"),
    ("architecture.md", "core ← data ← models ← objectives ← eval "): ("text", "the layer order"),
    ("audit.md", "# service.yaml"): ("audit", ""),
    ("benchmarks.md", "rewardplane eval --benchmark rewardbench "): ("cli", "synopsis; needs the benchmark files"),
    ("benchmarks.md", "rewardplane eval --benchmark rewardbench2"): ("cli", "needs a model"),
    ("benchmarks.md", "rewardplane: error: rb.jsonl: not in the "): ("text", "an error line"),
    ("config.md", "unknown config key run.max_step (did you "): ("text", "an error line"),
    ("config.md", "scorers[2].options.timeout_s must be >= 0"): ("text", "an error line"),
    ("data.md", "read (JSONL / JSON array / Parquet, strea"): ("text", "the pipeline's stages"),
    ("data.md", "rewardplane data prepare pairs.jsonl --out"): ("cli", "needs the user's pairs"),
    ("data.md", "$ rewardplane data synth --out synth.json"): ("console", "test_docs_figures.py"),
    ("data.md", "$ rewardplane train rm --config cfg.yaml "): ("cli", "an error transcript"),
    ("deploy.md", "rewardplane serve --deploy deploy.yaml   "): ("cli", "needs GPUs"),
    ("deploy.md", "mode: mps                 # dedicated | s"): ("deploy", ""),
    ("deploy.md", "# head node"): ("text", "ray cluster commands"),
    ("dpo.md", "rewardplane train dpo --config cfg.yaml ["): ("cli", "synopsis"),
    ("dpo.md", "model: {path: ./sft-model}            # o"): ("train_dpo", ""),
    ("dpo.md", "model:"): ("train_dpo", "LoRA"),
    ("dpo.md", "dpo:"): ("train_dpo", "a pinned snapshot reference"),
    ("evaluation.md", "rewardplane data synth --out eval.jsonl -"): ("cli", "needs a model"),
    ("evaluation.md", "rewardplane eval    --model CKPT_OR_HF_DI"): ("cli", "synopsis"),
    ("evaluation.md", "eval: 288/600 pair (48%) 9.05 pair/s eta"): ("text", "progress output"),
    ("evaluation.md", "$ rewardplane train rm --config src/rewar"): ("console", "test_docs_figures.py"),
    ("evaluation.md", "subset                     n   acc A   a"): ("text", "compare's table"),
    ("export.md", "rewardplane export hf RUN/checkpoints/ste"): ("cli", "synopsis"),
    ("integrations.md", "rewardplane serve --config service.yaml -"): ("cli", "needs a server"),
    ("integrations.md", "python -m verl.trainer.main_ppo ... \\"): ("text", "verl's command line"),
    ("integrations.md", "+reward.custom_reward_function.reward_kwa"): ("text", "verl's overrides"),
    ("integrations.md", "# the first scorer listed in service.yaml"): ("text", "OpenRLHF's command line"),
    ("integrations.md", "backend:"): ("text", "UniRL's config, not ours"),
    ("lifecycle.md", "resident ──drain──▶ draining ──offload──▶"): ("text", "the state machine"),
    ("lifecycle.md", "curl -X POST 'http://127.0.0.1:8000/v1/li"): ("text", "HTTP calls to a running server"),
    ("lifecycle.md", "scorers:"): ("service", "residency"),
    ("lifecycle.md", "for step in steps:"): ("text", "pseudo-code"),
    ("qualify.md", "rewardplane bench --url http://127.0.0.1:"): ("cli", "needs a running service"),
    ("qualify.md", "rewardplane qualify --plan benchmarks/qua"): ("cli", "needs GPUs"),
    ("qualify.md", "gpus: [0]                      # the GPUs"): ("qualify", ""),
    ("qualify.md", "python -m rewardplane.bench.trace DIR/*.t"): ("text", "a module's own command line"),
    ("serve.md", "rewardplane serve                       "): ("cli", "needs models"),
    ("serve.md", "token: null                 # bearer toke"): ("service", "every top-level key"),
    ("serve.md", "- name: reward"): ("service", "a composite, as an entry of scorers:"),
    ("serve.md", "scorers[2].options.timeout_s must be >= 0"): ("text", "an error line"),
    ("training.md", "rewardplane train rm --config cfg.yaml [k"): ("cli", "synopsis"),
    ("tutorial-real-data.md", "source .venv/bin/activate"): ("text", "shell set-up"),
    ("tutorial-real-data.md", "rewardplane "): ("tour", "test_tutorial_real_data.py"),
    ("training.md", "RUN/config.yaml                  resolved"): ("text", "a run directory's files"),
    ("training.md", "$ rewardplane export hf runs/rm/checkpoint"): ("cli", "a transcript; needs a run"),
    ("training.md", "$ rewardplane train rm --config cfg.yaml "): ("cli", "a transcript; needs a run"),
    ("training.md", "rewardplane: training interrupted at step"): ("text", "Ctrl-C's output"),
    ("training.md", "# SmolLM2-135M-Instruct from the llm-smol"): ("text", "two alternatives with placeholders"),
    ("verifiers.md", "pip install 'rewardplane[serve,verifiers]"): ("text", "pip"),
    ("verifiers.md", "server ──tests──▶ zygote"): ("text", "the evaluator's boundary, drawn"),
    ("verifiers.md", "scorers:"): ("service", "verifiers"),
}  # fmt: skip


def _key(name: str, first: str) -> tuple[str, str] | None:
    """The BLOCKS entry of a block: the longest key of its file that its first line starts with."""
    keys = [k for k in BLOCKS if k[0] == name and first.startswith(k[1])]
    return max(keys, key=lambda k: len(k[1])) if keys else None


def blocks() -> list[tuple[str, str, str, str]]:
    """(file name, first line, language, body) of every block of a checked language."""
    out = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
            if match.group(1) in LANGUAGES:
                body = match.group(2)
                first = next((line.strip() for line in body.splitlines() if line.strip()), "")
                out.append((path.name, first, match.group(1), body))
    return out


def of_class(*classes: str) -> list[tuple[str, str, str]]:
    """(file, key, body) of the blocks of these classes (blocks sharing a key each count)."""
    out = []
    for name, first, _, body in blocks():
        key = _key(name, first)
        if key is not None and BLOCKS[key][0] in classes:
            out.append((name, key[1], body))
    return out


def test_every_block_has_a_class():
    keys = [(name, first, _key(name, first)) for name, first, _, _ in blocks()]
    missing = [(name, first[:60]) for name, first, key in keys if key is None]
    assert not missing, f"classify these doc blocks in BLOCKS: {missing}"
    stale = sorted(set(BLOCKS) - {key for _, _, key in keys})
    assert not stale, f"no doc block starts like these any more: {stale}"


# ---- commands ------------------------------------------------------------------------------------
SYNOPSIS = re.compile(r"\[|\.\.\.|\w\|\w|<\w")


def command_lines(body: str) -> list[str]:
    """The `rewardplane ...` lines of a block, continuations joined, comments and `$ ` dropped."""
    lines, current = [], ""
    for raw in body.splitlines():
        line = raw.removeprefix("$ ")
        code = (
            re.split(r"\s#(?:\s|$)", line, maxsplit=1)[0].rstrip()
            if not line.lstrip().startswith("#")
            else ""
        )
        current += code.rstrip("\\").strip() + " " if code else ""
        if code and not code.endswith("\\"):
            words = current.split()
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
                words.pop(0)
            if "-m" in words and "rewardplane" in words:  # torchrun ... -m rewardplane ...
                words = ["rewardplane", *words[words.index("rewardplane") + 1 :]]
            if words and words[0] == "rewardplane":
                lines.append(" ".join(words))
            current = ""
    return lines


def subparser(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, int]:
    """The (sub)parser a command's leading words select, and how many words it took."""
    used = 0
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or used >= len(words) or words[used] not in actions[0].choices:
            return parser, used
        parser, used = actions[0].choices[words[used]], used + 1


@pytest.mark.parametrize("where", sorted({f"{f}: {k}" for f, k, _ in of_class("cli", "tour", "console")}))
def test_every_documented_command_is_one_the_cli_takes(where, capsys):
    name, key = where.split(": ", 1)
    bodies = [b for f, k, b in of_class("cli", "tour", "console") if (f, k) == (name, key)]
    lines = [line for body in bodies for line in command_lines(body)]
    assert lines, f"{where}: no `rewardplane` line in a block classed as commands"
    for line in lines:
        words = shlex.split(line.replace("|", " | ") if SYNOPSIS.search(line) else line)[1:]
        parser, used = subparser(build_parser(), words)
        assert used, f"{where}: {line!r} names no command"
        options = {s for a in parser._actions for s in a.option_strings}
        named = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line)
        unknown = [option for option in named if option not in options]
        assert not unknown, f"{where}: {line!r}: no such option {unknown}"
        if not SYNOPSIS.search(line):
            try:
                build_parser().parse_args(words)
            except SystemExit:
                pytest.fail(f"{where}: {line!r} does not parse: {capsys.readouterr().err.strip()}")


# ---- configs -------------------------------------------------------------------------------------
def _load(kind: str, data: dict | list, tmp_path: Path):
    if isinstance(data, list):  # entries of `scorers:` shown alone
        data = {"scorers": data}
    path = tmp_path / "block.yaml"
    path.write_text(yaml.safe_dump(data))
    if kind in ("service", "audit"):
        from rewardplane.serve.config import config_from_dict

        if kind == "audit":  # the scorers an audit section names, as stand-ins
            names = {
                data["audit"]["proxy"],
                *(a for a in data["audit"].get("auditors", []) if isinstance(a, str)),
            }
            given = {s["name"] for s in data.get("scorers", [])}
            data = {
                **data,
                "scorers": data.get("scorers", []) + [{"name": n, "kind": "length"} for n in names - given],
            }
        return config_from_dict(data)
    if kind == "deploy":
        from rewardplane.deploy.config import DeviceProbe
        from rewardplane.deploy.launch import load_deploy

        return load_deploy(path, DeviceProbe(cuda_available=True, gpu_count=8, control_binary="/bin/true"))
    if kind in ("train_rm", "train_dpo"):
        from rewardplane.train import config as train_config

        return (train_config.load_config if kind == "train_rm" else train_config.load_dpo_config)(
            str(path), []
        )
    if kind == "qualify":
        from rewardplane.bench.qualify import load_plan

        return load_plan(path, [])
    raise AssertionError(kind)


CONFIGS = ("service", "audit", "deploy", "train_rm", "train_dpo", "qualify")


@pytest.mark.parametrize("index", range(len(of_class(*CONFIGS))))
def test_every_documented_config_loads(index, tmp_path):
    name, key, body = of_class(*CONFIGS)[index]
    kind = BLOCKS[(name, key)][0]
    _load(kind, yaml.safe_load(body), tmp_path)


# ---- one scoring call ----------------------------------------------------------------------------
RULE_KINDS = ("length", "exact_match", "regex", "math")
# a right, well-formatted answer: every documented rule scorer must give it a reward above 0
# (the verifiers.md composite's format component once compiled to a pattern that never matched)
FITTING = {"prompt": "What is 2 + 2?", "response": "2 + 2 = 4, so the answer is \\boxed{4}", "reference": "4"}


def rule_specs() -> list[tuple[str, dict]]:
    """(where, scorer spec) of every rule-based scorer of a service block, inline components of a
    composite included (a component naming a hosted scorer is scored as that scorer is)."""
    out = []
    for name, _key, body in of_class("service", "audit"):
        data = yaml.safe_load(body)
        for spec in data if isinstance(data, list) else data.get("scorers", []):
            if spec["kind"] in RULE_KINDS:
                out.append((f"{name}: {spec['name']}", spec))
            elif spec["kind"] == "composite":
                for c in spec["options"]["components"]:
                    if c.get("kind") in RULE_KINDS:
                        inline = {k: v for k, v in c.items() if k not in ("weight", "required")}
                        out.append((f"{name}: {spec['name']}.{c['name']}", inline))
    return out


def test_every_documented_rule_scorer_rewards_a_fitting_item():
    from rewardplane.serve.protocol import ItemError, ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    specs = rule_specs()
    assert len(specs) >= 4  # README's and verifiers.md's math, the composites' components
    for where, raw in specs:
        options = {**raw.get("options", {})}
        if raw["kind"] == "math":
            options["workers"] = 1  # one process: this is about the reward, not throughput
        scorer = build_scorer(ScorerSpec(**{**raw, "options": options}))
        scorer.load()
        try:
            (value,) = scorer.score_batch([ScoreItem(id="fit", **FITTING)])
        finally:
            getattr(scorer, "close", lambda: None)()
        assert not isinstance(value, ItemError) and value > 0, f"{where}: {value!r} for {FITTING}"
