"""`rewardplane score` and `serve` as a newcomer meets them: one line for a service that is not
there or a port that is taken, nothing half-written, bad lines skipped on request."""

from __future__ import annotations

import json
import socket

import pytest

from rewardplane.cli import main
from support.serve import LiveServer, make_config


@pytest.fixture(scope="module")
def server():
    cfg = make_config([{"name": "len", "kind": "length"}, {"name": "em", "kind": "exact_match"}])
    with LiveServer(cfg) as s:
        yield s


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("rewardplane: error:") and "Traceback" not in err
    return err


def _items(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_score_with_nothing_listening_is_one_line_and_writes_nothing(tmp_path, capsys):
    items = _items(tmp_path / "items.jsonl", [json.dumps({"id": "a", "response": "kiwi."})])
    url = f"http://127.0.0.1:{_free_port()}"
    for extra in ([], ["--scorers", "rm"]):
        out = tmp_path / "out.jsonl"
        assert main(["score", "--url", url, str(items), "--out", str(out), *extra]) == 2
        err = _one_line(capsys)
        assert f"cannot reach the service at {url}" in err and "rewardplane serve" in err
        assert not out.exists()


def test_skip_bad_lines_scores_the_rest_and_names_each_bad_line(server, tmp_path, capsys):
    lines = [json.dumps({"id": "a", "response": "kiwi."}), "{not json", json.dumps({"response": "no id"})]
    lines.append(json.dumps({"id": "b", "response": "plum."}))
    items = _items(tmp_path / "bad.jsonl", lines)
    out = tmp_path / "out.jsonl"
    argv = ["score", "--url", server.url, str(items), "--scorers", "len", "--out", str(out)]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert f"{items}:2: line is not valid JSON" in err and "--skip-bad-lines" in err and not out.exists()
    assert main([*argv, "--skip-bad-lines"]) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]
    err = capsys.readouterr().err
    assert (
        "skipped 2 bad lines" in err
        and "line 2: line is not valid JSON" in err
        and "line 3: id: Field required" in err
    )


def test_score_without_scorers_says_which_scorer_failed_and_why(server, tmp_path, capsys):
    """Without --scorers every hosted scorer runs: exact_match fails items that carry no reference,
    and the summary line says so, with the option that picks scorers."""
    items = _items(tmp_path / "items.jsonl", [json.dumps({"id": i, "response": "kiwi."}) for i in "abc"])
    assert main(["score", "--url", server.url, str(items), "--out", str(tmp_path / "o.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "3 of 3 items had scorer errors (em: missing_reference (3)" in err and "--scorers" in err
    assert main(["score", "--url", server.url, str(items), "--scorers", "len"]) == 0


def test_serve_on_a_busy_port_names_the_port_and_the_option(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("rewardplane.cli.serve.run_until_loaded", lambda *a: pytest.fail("started"))
    cfg = tmp_path / "service.yaml"
    cfg.write_text("scorers: [{name: len, kind: length}]\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--config", str(cfg), "--port", str(port)]) == 2
    err = _one_line(capsys)
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err


def test_score_error_carries_each_reason_not_only_its_code(server):
    """A GRPO run stopped on `ScoreError: 1 item score(s) failed: 0/rm: bad_input` with the reason
    only in `.failures`: the message is what the trainer prints, so it carries the reason."""
    from rewardplane.serve.client import RewardClient, ScoreError

    with RewardClient(server.url) as client, pytest.raises(ScoreError) as info:
        client.score([{"id": "0", "response": "kiwi."}], ["em"])
    assert (
        str(info.value)
        == "1 item score(s) failed: 0/em: missing_reference: exact_match needs the item's 'reference'"
    )


def test_serve_names_a_scorer_path_that_does_not_exist(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("rewardplane.cli.serve.run_until_loaded", lambda *a: pytest.fail("started"))
    cfg = tmp_path / "service.yaml"
    cfg.write_text("scorers: [{name: hf, kind: hf_seqcls, path: models/smol}]\n")
    assert main(["serve", "--config", str(cfg), "--port", str(_free_port())]) == 2
    err = _one_line(capsys)
    assert (
        "scorer 'hf' (path models/smol) failed to load: models/smol: not a directory (it does not exist"
        in err
    )
    assert "huggingface" not in err
