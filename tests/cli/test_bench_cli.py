import csv
import json

from rewardplane.cli import main
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


def test_bench_takes_the_token_from_a_file_or_the_environment_never_argv(tmp_path, capsys, monkeypatch):
    """`--token` on argv (visible in `ps`) is refused in one line before anything is sent, as by
    `rewardplane serve`; `--token-file` and REWARDPLANE_TOKEN authenticate; the secret is never
    written to the run file."""
    monkeypatch.delenv("REWARDPLANE_TOKEN", raising=False)
    argv = ["bench", "--scorers", "a", "--batch", "1", "--concurrency", "1", *FAST]
    assert main([*argv, "--url", "http://127.0.0.1:9", "--token", "s3cret", "--out", "x.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "s3cret" not in err
    assert "REWARDPLANE_TOKEN" in err and "--token-file" in err and "cannot reach" not in err
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    with serve_in_thread(make_app(["a"], token="s3cret")) as url:
        # without the token every request is refused (exit 1) ...
        assert main([*argv, "--url", url, "--out", str(tmp_path / "none.json")]) == 1
        capsys.readouterr()
        # ... with it, from the file or the environment, every request succeeds
        assert (
            main([*argv, "--url", url, "--token-file", str(secret), "--out", str(tmp_path / "f.json")]) == 0
        )
        monkeypatch.setenv("REWARDPLANE_TOKEN", "s3cret")
        assert main([*argv, "--url", url, "--out", str(tmp_path / "env.json")]) == 0
    for name in ("f.json", "env.json"):
        assert "s3cret" not in (tmp_path / name).read_text()
    assert (
        main([*argv, "--url", "http://127.0.0.1:9", "--token-file", str(tmp_path / "missing"), "--out", "x"])
        == 2
    )
    assert "--token-file" in capsys.readouterr().err
