"""Test doubles and a real uvicorn server on a random loopback port, shared by the serve tests."""

from __future__ import annotations

import io
import math
import socket
import threading
import time
from typing import Any, ClassVar

import httpx
import uvicorn

from rewardplane.core.errors import UsageError
from rewardplane.serve.app import create_app
from rewardplane.serve.backend import InProcessBackend
from rewardplane.serve.config import ServiceConfig, config_from_dict
from rewardplane.serve.protocol import ItemError, ScoreItem, ScorerInfo
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.common import as_text
from rewardplane.serve.scorers.options import ScorerOptions
from rewardplane.serve.scorers.registry import register_scorer


class DoubleOptions(ScorerOptions):
    sleep_s: float = 0.0
    """Seconds every batch sleeps."""
    fail_warmup: bool = False
    """Score the warm-up item NaN."""


class DoubleScorer(Scorer):
    """Scores len(response), except: "NAN" -> NaN, "INF" -> inf, "RAISE" -> the batch raises,
    "STR" -> a non-number, "ERR" -> an item-kind ItemError (`bad_image`), "DOWN" -> a
    service-kind one (`sandbox_error`). `options.sleep_s` slows every batch,
    `options.fail_warmup` breaks the warm-up. Every batch size is recorded in `batches`."""

    kind: ClassVar[str] = "double"
    modality: ClassVar = "rule"  # a rule (the length): "" scores 0.0 (docs/serve.md "Admission")
    Options = DoubleOptions
    batches: ClassVar[list[int]] = []

    def load(self) -> None:
        pass

    def item_tokens(self, item: ScoreItem) -> int:
        return len(as_text(item.response)) + 1

    def score_batch(self, items: list[ScoreItem]) -> list[Any]:
        DoubleScorer.batches.append(len(items))
        time.sleep(self.options.sleep_s)
        out: list[Any] = []
        for item in items:
            text = as_text(item.response)
            if self.options.fail_warmup and item.id == "warmup":
                out.append(math.nan)
            elif "RAISE" in text:
                raise RuntimeError("double told to raise")
            elif "NAN" in text:
                out.append(math.nan)
            elif "INF" in text:
                out.append(-math.inf)
            elif "STR" in text:
                out.append("not a number")
            elif "ERR" in text:
                out.append(ItemError("bad_image", "double item error"))
            elif "DOWN" in text:
                out.append(ItemError("sandbox_error", "double service error"))
            else:
                out.append(float(len(text)))
        return out

    def info(self) -> ScorerInfo:
        return ScorerInfo(
            self.name,
            self.kind,
            self.modality,
            "fp32",
            "cpu",
            "test",
            "ident-" + self.name,
            self.max_batch_size,
            self.max_wait_ms,
        )


register_scorer("double", DoubleScorer)


class RecordingScorer(Scorer):
    """Scores 1.0 and keeps every non-warm-up item it was given in `seen`, so a test can check
    which wire fields reached a scorer (in-process, through the app, or over the deploy transport)."""

    kind: ClassVar[str] = "recording"
    modality: ClassVar = "text"
    seen: ClassVar[list[ScoreItem]] = []

    def load(self) -> None:
        pass

    def score_batch(self, items: list[ScoreItem]) -> list[float]:
        RecordingScorer.seen.extend(i for i in items if i.id != "warmup")
        return [1.0] * len(items)

    def info(self) -> ScorerInfo:
        return ScorerInfo(self.name, self.kind, self.modality, "none", "cpu", "test", "rec", 8, 1.0)


register_scorer("recording", RecordingScorer)


class LiveServer:
    """The app under a real uvicorn on 127.0.0.1:<free port>, in a daemon thread, bounded waits.
    `backend`: what `rewardplane serve --deploy` builds (the gateway, Ray); default in-process."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        backend: Any = None,
        wait_ready: bool = True,
        ready_timeout_s: float = 300,
    ) -> None:
        self.config = config
        self.ready_timeout_s = ready_timeout_s
        self.backend = backend if backend is not None else InProcessBackend(config)
        self.app = create_app(self.backend, config)
        self.wait_ready = wait_ready
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        """Waits for the condition, not for a time: until /health/ready says 200, failing at once
        on a scorer whose start failed (it never becomes ready) and otherwise only after
        `ready_timeout_s`, a ceiling for a starved machine (a Ray start on two busy cores took
        over 240 s). A probe that times out is asked again: a loaded event loop is slow, not down."""
        self._thread.start()
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        body: Any = None
        while self.wait_ready:
            try:
                answer = httpx.get(self.url + "/health/ready", timeout=30)
            except httpx.TransportError as exc:
                body = repr(exc)
            else:
                if answer.status_code == 200:
                    break
                body = answer.json()
                failed = {k: v for k, v in body.get("scorers", {}).items() if str(v).startswith("failed")}
                if failed:
                    raise RuntimeError(f"service cannot become ready: {failed}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"service did not become ready in {self.ready_timeout_s:.0f} s: {body}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()


def make_config(scorers: list[dict[str, Any]], **top: Any) -> ServiceConfig:
    return config_from_dict({"scorers": scorers, **top})


def jpeg_bytes(size: tuple[int, int] = (40, 30), color: tuple[int, int, int] = (10, 200, 30)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="JPEG")
    return buf.getvalue()


def png_bytes(size: tuple[int, int] = (40, 30), seed: int = 0) -> bytes:
    import numpy as np
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def score_requests(url: str) -> float:
    """How many `POST /v1/score` requests the service at `url` has answered (its own /metrics)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rewardplane_requests_total{") and 'route="/v1/score"' in line
    )


def hold_the_port(monkeypatch) -> None:
    """Make `rewardplane serve` find its port taken (as when the tour's own server holds :8000),
    without binding one: what a test checks must not depend on what else listens."""

    def port_held(host: str, port: int) -> None:
        raise UsageError(f"port {port} on {host} is already in use", code="port_in_use")

    monkeypatch.setattr("rewardplane.cli.serve.check_port_free", port_held)
