from rewardplane.cli import main


def test_version(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "rewardplane" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_serve_has_no_per_request_access_log_unless_asked(tmp_path, monkeypatch):
    calls = []
    # the server is built but not run (rewardplane.cli.serve.run_until_loaded runs it), and no port
    # is tried: the test passes whatever listens on the machine
    monkeypatch.setattr("rewardplane.cli.serve.check_port_free", lambda host, port: None)
    monkeypatch.setattr(
        "rewardplane.cli.serve.run_until_loaded",
        lambda app, backend, config, server: calls.append(server.config),
    )
    cfg = tmp_path / "service.yaml"
    cfg.write_text("scorers: [{name: len, kind: length}]\n")
    assert main(["serve", "--config", str(cfg), "--port", "18999"]) == 0
    assert main(["serve", "--config", str(cfg), "--port", "18999", "--access-log"]) == 0
    assert [c.access_log for c in calls] == [False, True]
    assert calls[0].host == "127.0.0.1"  # loopback unless told otherwise


def test_serve_refuses_to_start_with_only_the_pre_rename_token(tmp_path, monkeypatch, capsys):
    """A deployment upgraded from rewardkit that still exports REWARDKIT_TOKEN must not come up
    unauthenticated: rewardplane reads REWARDPLANE_TOKEN alone, so it refuses and names it."""
    started = []
    monkeypatch.setattr("rewardplane.cli.serve.run_until_loaded", lambda *a: started.append(a))
    monkeypatch.setattr("rewardplane.cli.serve.check_port_free", lambda host, port: None)
    monkeypatch.setenv("REWARDKIT_TOKEN", "s3cret")
    monkeypatch.delenv("REWARDPLANE_TOKEN", raising=False)
    cfg = tmp_path / "service.yaml"
    cfg.write_text("scorers: [{name: len, kind: length}]\n")
    assert main(["serve", "--config", str(cfg), "--port", "18999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "REWARDPLANE_TOKEN" in err[0] and "s3cret" not in err[0]
    assert not started
    monkeypatch.setenv("REWARDPLANE_TOKEN", "s3cret")
    assert main(["serve", "--config", str(cfg), "--port", "18999"]) == 0
    assert len(started) == 1


def test_the_distribution_installs_rewardplane_and_nothing_named_rewardkit():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["name"] == "rewardplane"
    assert set(project["project"]["scripts"]) == {"rewardplane"}
    assert "rewardkit" not in (root / "pyproject.toml").read_text().lower()
    assert [p.name for p in (root / "src").iterdir() if p.is_dir() and not p.name.endswith("egg-info")] == [
        "rewardplane"
    ]
