"""Every command checks its paths, its config and its output before it imports torch (issue 47):
a missing file or an unknown key is answered at once. Checked by what is imported when the error
is raised, not by timing: one interpreter runs the commands in turn and reports the first one
after which torch is in sys.modules (a command that is clean leaves the next one clean)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rewardplane.eval.benchmarks.runner import BENCHMARKS
from rewardplane.objectives.registry import OBJECTIVES
from support.docs import ROOT

RUNNER = """
import json, sys
from rewardplane.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    if code != 2 or "torch" in sys.modules:
        print(json.dumps({"argv": argv, "code": code, "torch": "torch" in sys.modules}))
        sys.exit(1)
print("clean")
"""


def commands(tmp) -> list[list[str]]:
    config = f"{tmp}/service.yaml"
    with open(config, "w") as handle:
        handle.write("scorers: [{name: len, kind: length, optoins: {}}]\n")
    train = f"{tmp}/train.yaml"
    with open(train, "w") as handle:
        handle.write("model: {tiny: tiny-llama}\nrun: {max_step: 3}\n")  # the unknown key `max_step`
    loss = f"{tmp}/loss.yaml"
    with open(loss, "w") as handle:
        handle.write("model: {tiny: tiny-llama}\nloss: {bogus: 1}\n")  # an objective's own section
    dpo = f"{tmp}/dpo.yaml"
    with open(dpo, "w") as handle:
        handle.write("model: {tiny: tiny-llama}\ndpo: {bogus: 1}\n")
    taken = f"{tmp}/taken"
    os.makedirs(taken)
    open(f"{taken}/x", "w").close()
    return [
        ["train", "rm", "--config", "nope.yaml"],
        ["train", "dpo", "--config", "nope.yaml"],
        ["train", "rm", "--config", train],  # the unknown key run.max_step
        ["train", "dpo", "--config", train, "run.max_step=null", "optim.lr=fast"],  # still max_step
        ["train", "rm", "nokey=1"],
        ["train", "rm", "--config", loss],  # the unknown key loss.bogus
        ["train", "dpo", "--config", dpo],  # the unknown key dpo.bogus
        *(["train", o.command, f"{o.section}.bogus=1"] for o in OBJECTIVES.values()),  # every objective's own
        ["train", "dpo", "dpo.beta=0"],  # a bad value in the objective's section
        ["train", "dpo", "dpo.reference.bogus=1"],
        ["train", "dpo", "model.lora.r=8"],  # LoRA without a stated reference (check_written)
        ["eval", "--model", "nope", "--probe", "p.json", "--data", "d.jsonl", "--out", f"{tmp}/o1"],
        ["eval", "--model", f"{tmp}", "--probe", config, "--data", "d.jsonl", "--out", f"{tmp}/o2"],
        ["eval", "--model", "nope", "--benchmark", "rewardbench2", "--data", "d.parquet", "--out", f"{tmp}/o3"],
        ["eval", "--model", f"{tmp}", "--benchmark", "rm-bench", "--data", "d.json", "--out", f"{tmp}/o4"],
        ["eval", "--model", f"{tmp}", "--probe", config, "--data", config, "--out", taken],
        ["compare", "a.jsonl", "b.jsonl", "--out", f"{tmp}/c"],
        ["report", "nope"],
        ["export", "hf", "nope", f"{tmp}/e"],
        ["export", "hf", f"{tmp}", taken],
        ["serve", "--config", "nope.yaml"],
        ["serve", "--config", config],  # the unknown key `optoins`
        ["serve", "--deploy", "nope.yaml"],
        ["data", "prepare", "nope", "--out", f"{tmp}/d", "--eval-size", "1", "--seed-key", "k"],
        ["data", "validate", "nope"],
        ["data", "freeze-probe", "nope", "--out", f"{tmp}/p.json"],
        ["score", "nope", "--url", "http://127.0.0.1:9"],
        ["bench", "--url", "http://127.0.0.1:9", "--scorers", "a", "--out", f"{tmp}/b.json", "--inputs", "nope"],
        ["qualify", "--plan", "nope.yaml", "--out", f"{tmp}/q"],
    ]  # fmt: skip


def test_no_command_imports_torch_before_refusing_a_missing_path_or_an_unknown_key(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argvs = commands(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(argvs)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert run.stdout.strip() == "clean", run.stdout + run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == len(argvs) and all(line.startswith("rewardplane: error:") for line in lines), lines


def test_a_missing_benchmark_file_says_where_its_data_comes_from(tmp_path, capsys):
    """docs/benchmarks.md's table and the error name the same source, command and sample."""
    from rewardplane.cli import main

    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    for name, module in BENCHMARKS.items():
        source = module.SOURCE
        assert f"`{source['fetch']}`" in docs and (ROOT / source["sample"]).is_file(), name
        argv = [
            "eval",
            "--benchmark",
            name,
            "--model",
            str(tmp_path),
            "--data",
            "nope.parquet",
            "--out",
            str(tmp_path / name),
        ]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and source["fetch"] in err and source["sample"] in err, err
