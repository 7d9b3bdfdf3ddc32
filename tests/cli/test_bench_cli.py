import csv
import json

from rewardkit.cli import main
from support.bench_fake_server import make_app, serve_in_thread

FAST = ["--window-s", "0.15", "--max-windows", "3", "--requests", "1", "--warmup", "1", "--corpus-size", "8"]


def test_bench_writes_json_and_perf_analyzer_csv(tmp_path, capsys):
    out, table = tmp_path / "run.json", tmp_path / "run.csv"
    with serve_in_thread(make_app(["a", "b"], mode="consolidated")) as url:
        code = main(["bench", "--url", url, "--scorers", "a,b", "--batch", "1,2", "--concurrency", "2",
                     "--slo-ms", "5000", "--coverage-pass", "--out", str(out), "--csv", str(table), *FAST])  # fmt: skip
    assert code == 0
    run = json.loads(out.read_text())
    assert run["mode"] == "consolidated" and run["config"]["batches"] == [1, 2]
    assert run["corpus"]["source"] == "generated" and run["corpus"]["size"] == 8
    assert run["coverage"]["total"] == 4 and len(run["scores"]) == 8  # batches of 2 over 8 items
    rows = list(csv.DictReader(table.open()))
    assert [(r["Batch"], r["Concurrency"], r["Scorers"]) for r in rows] == [
        ("1", "2", "a+b"),
        ("2", "2", "a+b"),
    ]
    assert float(rows[0]["Inferences/Second"]) > 0 and int(rows[0]["p95 latency"]) > 0  # microseconds
    assert "regime" in capsys.readouterr().out


def test_bench_exits_1_on_failed_requests_and_2_on_bad_input(tmp_path, capsys):
    with serve_in_thread(make_app(["a"], faults={"a": "nan"})) as url:
        code = main(["bench", "--url", url, "--scorers", "a", "--batch", "1", "--concurrency", "1",
                     "--out", str(tmp_path / "r.json"), *FAST])  # fmt: skip
        assert code == 1
        assert "score_non_finite" in capsys.readouterr().err
        assert main(["bench", "--url", url, "--scorers", "a", "--batch", "9", "--out", "x.json", *FAST]) == 2
        assert "larger than the corpus" in capsys.readouterr().err
    assert main(["bench", "--url", "http://127.0.0.1:9", "--scorers", "a", "--out", "x.json", *FAST]) == 2
    assert "cannot reach" in capsys.readouterr().err
