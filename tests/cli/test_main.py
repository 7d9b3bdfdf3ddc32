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
    calls = []
    # the server is built but not run (rewardkit.cli.serve.run_until_loaded runs it)
    monkeypatch.setattr(
        "rewardkit.cli.serve.run_until_loaded",
        lambda app, backend, config, server: calls.append(server.config),
    )
    cfg = tmp_path / "service.yaml"
    cfg.write_text("scorers: [{name: len, kind: length}]\n")
    assert main(["serve", "--config", str(cfg), "--port", "18999"]) == 0
    assert main(["serve", "--config", str(cfg), "--port", "18999", "--access-log"]) == 0
    assert [c.access_log for c in calls] == [False, True]
    assert calls[0].host == "127.0.0.1"  # loopback unless told otherwise
