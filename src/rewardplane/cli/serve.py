"""`rewardplane serve` (run the service) and `rewardplane score` (score a JSONL file through it)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from rewardplane.core.errors import UsageError
from rewardplane.core.outputs import add_overwrite_option, check_out_file

DEMO_MODEL = Path("demo-run/model")


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve reward scorers over HTTP (docs/serve.md)",
        description="Serve the scorers of a service YAML (--config) or a deploy YAML (--deploy) over HTTP,"
        " with dynamic batching. Prints one line when every scorer is ready (names, kinds, device, URL)"
        " and exits 2 naming each scorer that failed to load. Without --config: the demo reward model"
        " `make demo` trains. See docs/serve.md.",
    )
    serve.add_argument(
        "--config", type=Path, help="service YAML; default: the demo reward model at demo-run/model"
    )
    serve.add_argument(
        "--deploy", type=Path, help="deploy YAML: scorers in worker processes (docs/deploy.md)"
    )
    serve.add_argument(
        "--backend", default="workers", choices=["workers", "ray"], help="with --deploy: workers or Ray Serve"
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default %(default)s)")
    add_token_options(
        serve,
        "require the bearer token in this file (default: $REWARDPLANE_TOKEN, else the config's, else none)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--debug", action="store_true", help="debug logging, with tracebacks for scorers that fail to load"
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log one line per request (off by default: at thousands of requests/s the lines cost "
        "event-loop time, and /metrics already counts requests by status and code)",
    )
    serve.set_defaults(func=cmd_serve)

    score = subparsers.add_parser("score", help="score a JSONL file of items through a running service")
    score.add_argument(
        "file", type=Path, help="JSONL: {id, prompt, response, image?: path|{b64}, reference?}"
    )
    score.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    score.add_argument(
        "--scorers",
        help="comma-separated scorer names (default: every scorer the service hosts; a scorer that"
        " needs a field the items lack, e.g. exact_match's 'reference', then fails those items)",
    )
    score.add_argument(
        "--out", type=Path, help="write results as JSONL here, once all are scored (default: stdout)"
    )
    score.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="score the lines that parse and report the others by line number (default: refuse the file)",
    )
    score.add_argument("--batch-size", type=int, default=64, help="items per request")
    add_token_options(score, "file holding the bearer token (default: $REWARDPLANE_TOKEN)")
    score.add_argument("--allow-partial", action="store_true", help="exit 0 even when some items failed")
    add_overwrite_option(score, "an existing --out file")
    score.set_defaults(func=cmd_score)


TOKEN_ARGV_HINT = (
    "--token would show the secret to every user in `ps`; set REWARDPLANE_TOKEN or pass --token-file PATH"
)


def read_token_file(path: Path) -> str:
    """The token in `path` (surrounding whitespace stripped); a one-line UsageError otherwise."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--token-file {path}: {exc}") from None
    if not token:
        raise UsageError(f"--token-file {path} is empty")
    return token


def add_token_options(parser: argparse.ArgumentParser, help_text: str) -> None:
    """`--token-file PATH`, and a hidden `--token` that `token_from_args` refuses: every command
    that talks to a service takes its secret the same way, never on argv (visible in `ps`)."""
    parser.add_argument("--token-file", type=Path, help=help_text)
    parser.add_argument("--token", help=argparse.SUPPRESS)


def token_from_args(args: argparse.Namespace) -> str | None:
    """The `--token-file` token, else None (the caller falls back to $REWARDPLANE_TOKEN); a
    `--token` on argv is a one-line usage error naming the alternatives."""
    if args.token is not None:
        raise UsageError(TOKEN_ARGV_HINT)
    return read_token_file(args.token_file) if args.token_file else None


def _demo_config():
    from rewardplane.serve.config import ServiceConfig
    from rewardplane.serve.scorers.registry import ScorerSpec

    if not DEMO_MODEL.is_dir():
        raise UsageError(
            f"no --config given and no demo reward model at {DEMO_MODEL}; run `make demo` first "
            "or pass --config service.yaml (see docs/serve.md)"
        )
    return ServiceConfig(scorers=[ScorerSpec(name="rm", kind="rm", path=str(DEMO_MODEL))])


def _scorer_source(config, name: str) -> str:
    for spec in getattr(config, "scorers", []):
        if spec.name == name:
            if spec.path is not None:
                return f"path {spec.path}"
            return f"shape {spec.shape}" if spec.shape is not None else f"kind {spec.kind}"
    return "path unknown"


def start_failure(app, backend, config) -> str | None:
    """One line per scorer that failed to load (scorer, path, cause), else None."""
    task = getattr(app.state, "start_task", None)
    if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        return " ".join(f"the service failed to start: {type(exc).__name__}: {exc}".split())
    _, details = backend.ready()
    failed = {
        n: str(s)
        for n, s in details.items()
        if str(s).startswith("failed") or (str(s).startswith("worker ") and str(s).endswith(" failed"))
    }
    if not failed:
        return None
    parts = []
    load_failure = getattr(backend, "load_failure", None)  # the deploy gateway: the worker's own words
    for name, status in failed.items():
        status = (load_failure(name) if load_failure is not None else None) or status
        cause = " ".join(status.removeprefix("failed: ").removeprefix(f"{name}: ").split())
        parts.append(f"scorer {name!r} ({_scorer_source(config, name)}) failed to load: {cause}")
    return "\n".join(part[:2000] for part in parts)


def ready_line(backend, server_config) -> str:
    """The one line `serve` prints once every scorer is ready: names, kinds, devices and the URL."""
    host = server_config.host
    url = f"http://{f'[{host}]' if ':' in host else host}:{server_config.port}"
    infos = backend.scorer_infos()
    scorers = ", ".join(f"{name} ({info.kind}, {info.device})" for name, info in infos.items())
    return f"rewardplane: ready: {len(infos)} scorer{'s' if len(infos) != 1 else ''} at {url}: {scorers}"


def run_until_loaded(app, backend, config, server) -> str | None:
    """Serve with uvicorn; as soon as the background load finishes with a scorer that failed,
    stop and return the one-line reason (the CLI exits 2): a service that can never become
    ready must not sit answering 503."""
    import asyncio

    failure: str | None = None

    async def main() -> None:
        nonlocal failure
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        start_task = getattr(app.state, "start_task", None)
        if start_task is not None and not serving.done():
            await asyncio.wait({start_task, serving}, return_when=asyncio.FIRST_COMPLETED)
            if start_task.done():
                failure = start_failure(app, backend, config)
                if failure is not None:
                    server.should_exit = True
                else:
                    print(ready_line(backend, server.config), flush=True)
        elif start_task is None and not serving.done():
            print(ready_line(backend, server.config), flush=True)
        await serving

    asyncio.run(main())
    return failure


def refuse_legacy_token() -> None:
    """Refuse to start when only the pre-rename `REWARDKIT_TOKEN` is set.

    rewardplane reads `REWARDPLANE_TOKEN` alone; a deployment upgraded from rewardkit that still
    exports the old name would otherwise come up without authentication.
    """
    if os.environ.get("REWARDKIT_TOKEN") and not os.environ.get("REWARDPLANE_TOKEN"):
        raise UsageError(
            "REWARDKIT_TOKEN is set but rewardplane reads REWARDPLANE_TOKEN; set REWARDPLANE_TOKEN"
            " (and unset REWARDKIT_TOKEN) so the service does not start without its token"
        )


def check_port_free(host: str, port: int) -> None:
    """Refuse, in one line naming the port and the option, when `host:port` cannot be bound (another
    server listens there). Bound as uvicorn binds (SO_REUSEADDR), then released at once."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"port {port} on {host} is already in use (another server?): pass --port N to serve"
                    " on another port, or stop what listens there",
                    code="port_in_use",
                ) from None
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror} (--host / --port)") from None


def check_scorer_paths(config) -> None:
    """A scorer `path` that does not exist is one line naming the scorer and the path, before
    transformers takes it for a Hub repo id and answers about huggingface.co (nothing is downloaded)."""
    for spec in getattr(config, "scorers", []):
        if spec.path is not None and not Path(spec.path).exists():
            raise UsageError(  # worded as the load failures `start_failure` reports
                f"scorer {spec.name!r} (path {spec.path}) failed to load: {spec.path}: not a directory (it"
                " does not exist; scorers load local directories only, nothing is downloaded)",
                code="no_such_path",
            )


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rewardplane.serve.app import create_app
    from rewardplane.serve.backend import InProcessBackend
    from rewardplane.serve.config import load_config

    refuse_legacy_token()
    if args.debug:
        args.log_level = "debug"
        os.environ["REWARDPLANE_DEBUG"] = "1"  # deploy workers inherit it
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1..65535, got {args.port}")
    if args.deploy and args.config:
        raise UsageError("give --config or --deploy, not both (a deploy file holds the scorers too)")
    if args.deploy:  # the files first: a wrong path or key is answered whatever holds the port
        from rewardplane.deploy.launch import build_backend, load_deploy

        deploy, config = load_deploy(args.deploy)
    else:
        config = load_config(args.config) if args.config else _demo_config()
        check_scorer_paths(config)
    check_port_free(args.host, args.port)  # before any scorer loads or worker starts
    backend = build_backend(deploy, args.backend) if args.deploy else InProcessBackend(config)
    if (token := token_from_args(args)) is not None:
        config = config.model_copy(update={"token": token})
    if args.host not in ("127.0.0.1", "localhost", "::1") and config.resolved_token() is None:
        logging.getLogger(__name__).warning(
            "binding %s without a token: anyone who can reach it can score", args.host
        )
    app = create_app(backend, config)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log
        )
    )
    failure = run_until_loaded(app, backend, config, server)
    if failure is not None:  # one line per failed scorer, exit 2 (`--debug` logs the tracebacks above)
        *others, last = failure.splitlines()
        for line in others:
            print(f"rewardplane: error: {line}", file=sys.stderr)
        raise UsageError(last)
    return 0


def _failure_summary(rows: list[dict]) -> str:
    """`scorer: code (count)` for the failed (item, scorer) results, most frequent first."""
    from collections import Counter

    counts = Counter(f"{scorer}: {error['code']}" for row in rows for scorer, error in row["errors"].items())
    return ", ".join(f"{name} ({count})" for name, count in counts.most_common())


def cmd_score(args: argparse.Namespace) -> int:
    """Score a JSONL file through a running service. `--out` is written once, atomically, after
    the last item is scored: a failure (no service, a refused request) leaves no file behind."""
    from tqdm import tqdm

    from rewardplane.core.atomic import write_text
    from rewardplane.serve.client import RewardClient, ServiceError
    from rewardplane.serve.protocol.codec import BAD_LINE, read_items

    if args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    if args.out is not None:
        check_out_file(args.out, overwrite=args.overwrite)
    token = token_from_args(args)
    bad: list[tuple[int, str]] | None = [] if args.skip_bad_lines else None
    try:
        items = read_items(args.file, bad=bad)
    except UsageError as exc:
        if exc.code == BAD_LINE:
            raise UsageError(f"{exc} (--skip-bad-lines scores the other lines)") from None
        raise
    rows: list[dict] = []
    try:
        with RewardClient(args.url, token=token, max_retries=0) as probe:  # says at once when nothing listens
            hosted = [s["name"] for s in probe.scorers()]
        with RewardClient(args.url, token=token, allow_partial=True) as client:
            names = args.scorers.split(",") if args.scorers else hosted
            with tqdm(total=len(items), unit="item", file=sys.stderr) as bar:
                for start in range(0, len(items), args.batch_size):
                    chunk = items[start : start + args.batch_size]
                    rows += [
                        {"id": r.id, "scores": r.scores, "errors": r.errors}
                        for r in client.score(chunk, names)
                    ]
                    bar.update(len(chunk))
    except ServiceError as exc:
        if exc.status is None:  # no answer at all: connection_failed, client_timeout
            raise UsageError(
                f"cannot reach the service at {args.url} ({exc.message}); is `rewardplane serve`"
                " running there? (nothing was written)",
                code="unreachable",
            ) from None
        raise UsageError(f"service refused the request: {exc.message}") from None
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if args.out:
        write_text(args.out, text)
    else:
        sys.stdout.write(text)
    if bad:
        shown = "; ".join(f"line {n}: {reason}" for n, reason in bad[:10])
        more = f"; ... ({len(bad) - 10} more)" if len(bad) > 10 else ""
        lines = "line" if len(bad) == 1 else "lines"
        print(f"rewardplane: skipped {len(bad)} bad {lines} of {args.file}: {shown}{more}", file=sys.stderr)
    failed = sum(bool(row["errors"]) for row in rows)
    if failed:
        hint = "" if args.scorers else "; --scorers NAME,... scores with some of the hosted scorers only"
        print(
            f"rewardplane: {failed} of {len(items)} items had scorer errors ({_failure_summary(rows)};"
            f" see 'errors' in the output){hint}",
            file=sys.stderr,
        )
        return 0 if args.allow_partial else 1
    return 0
