from rewardkit.cli import main


def test_version(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "rewardkit" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_serve_has_no_per_request_access_log_unless_asked(tmp_path, monkeypatch):
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    cfg = tmp_path / "service.yaml"
    cfg.write_text("scorers: [{name: len, kind: length}]\n")
    assert main(["serve", "--config", str(cfg), "--port", "18999"]) == 0
    assert main(["serve", "--config", str(cfg), "--port", "18999", "--access-log"]) == 0
    assert [kw["access_log"] for kw in calls] == [False, True]
    assert calls[0]["host"] == "127.0.0.1"  # loopback unless told otherwise
