"""A stand-in for the reward client of UniRL (`unirl/reward/remote.py`, `RemoteRewardBackend`),
which is not installable here: it builds and checks requests the way that client does, written
from its documented behaviour, so the UniRL route is tested against the client's semantics.

What it reproduces: images as RGB JPEG (quality 95) in base64; `history` of one turn, or a
conditioning turn first for image-to-image; per-item identities whose `request_id` is the sample
id (else a uuid) and whose `idempotency_key` is a SHA-256 over the protocol, request id, rewards,
policy version, scorer-version pin and a payload fingerprint; chunked `POST /score` calls with
retries on timeouts, 429 and 5xx (other 4xx raise at once); the identity echo check; per-reward
parsing with the first sub-metric, a non-finite value treated as a failure, and `/health`'s
required-reward check.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import requests

IDENTITY_KEYS = ("request_id", "sample_id", "group_id", "source_rank", "policy_version", "idempotency_key")


def jpeg_b64(image, quality: int = 95) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=quality)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class UniRLClient:
    base_url: str
    required_rewards: list[str]
    expected_scorer_version: str | None = None
    request_batch_size: int | None = None
    max_retries: int = 3
    retry_delay: float = 0.01
    source_rank: int | None = None
    session: requests.Session = field(default_factory=requests.Session)
    posts: int = 0

    def __post_init__(self) -> None:
        self.session.trust_env = False

    def wire_request(self, history, *, sample_id=None, group_id=None, metadata=None) -> dict[str, Any]:
        media = ":".join(t.get("image_b64") or "" for t in history)
        text = history[-1].get("text", "")
        fingerprint = _digest(
            hashlib.sha256(media.encode()).hexdigest(), text, json.dumps(metadata, sort_keys=True)
        )
        policy_version = metadata.get("policy_version") if isinstance(metadata, dict) else None
        request_id = str(sample_id or uuid.uuid4())
        key_input = json.dumps(
            {
                "protocol": "1",
                "request_id": request_id,
                "required_rewards": self.required_rewards,
                "policy_version": policy_version,
                "scorer_version": self.expected_scorer_version,
                "payload_fingerprint": fingerprint,
            },
            sort_keys=True,
        )
        return {
            "history": history,
            "required_rewards": list(self.required_rewards),
            "metadata": metadata,
            "request_id": request_id,
            "sample_id": sample_id,
            "group_id": group_id,
            "source_rank": self.source_rank,
            "policy_version": policy_version if isinstance(policy_version, int) else None,
            "scorer_version": self.expected_scorer_version,
            "idempotency_key": hashlib.sha256(key_input.encode()).hexdigest(),
        }

    def post(self, wire: list[dict[str, Any]]) -> dict[str, Any]:
        """All chunks, merged; identities checked against what was sent."""
        size = self.request_batch_size or max(1, len(wire))
        results, errors = [], []
        for start in range(0, len(wire), size):
            chunk = wire[start : start + size]
            raw = self._post_once({"protocol_version": "1", "requests": chunk})
            if raw.get("protocol_version") not in (None, "1"):
                raise ValueError(f"protocol_version {raw.get('protocol_version')!r}")
            got_results, got_errors = list(raw.get("results") or []), list(raw.get("errors") or [])
            if len(got_results) > len(chunk) or len(got_errors) > len(chunk):
                raise ValueError("more rows than requested")
            got_results += [{}] * (len(chunk) - len(got_results))
            got_errors += [{}] * (len(chunk) - len(got_errors))
            identities = raw.get("identities") or []
            if len(identities) != len(chunk):
                raise ValueError(f"{len(identities)} identities for {len(chunk)} requests")
            for sent, echoed in zip(chunk, identities, strict=True):
                for key in IDENTITY_KEYS:
                    if echoed.get(key) != sent.get(key):
                        raise ValueError(f"identity {key}: sent {sent.get(key)!r}, got {echoed.get(key)!r}")
                pin = self.expected_scorer_version
                if pin is not None and echoed.get("scorer_version") != pin:
                    raise ValueError(f"scorer_version {echoed.get('scorer_version')!r} != {pin!r}")
            results += got_results
            errors += got_errors
        return {"results": results, "errors": errors}

    def _post_once(self, payload: dict[str, Any]) -> dict[str, Any]:
        last: Exception | None = None
        for attempt in range(self.max_retries):
            self.posts += 1
            try:
                resp = self.session.post(f"{self.base_url}/score", json=payload, timeout=60)
                resp.raise_for_status()
                return resp.json()
            except requests.exceptions.Timeout as exc:
                last = exc
            except requests.exceptions.RequestException as exc:
                status = getattr(getattr(exc, "response", None), "status_code", None)
                if status is not None and 400 <= status < 500 and status != 429:
                    raise
                last = exc
            if attempt < self.max_retries - 1:
                time.sleep(self.retry_delay)
        raise RuntimeError(f"failed after {self.max_retries} attempts") from last

    def rewards(self, merged: dict[str, Any]) -> tuple[list[float | None], list[str | None]]:
        """Per request: the mean of its rewards' first sub-metric (None if any failed), and errors."""
        values, problems = [], []
        for result, error in zip(merged["results"], merged["errors"], strict=True):
            scores, parts = [], []
            for name in self.required_rewards:
                metrics = result.get(name)
                if metrics is None:
                    parts.append(f"{name}: {error.get(name, 'missing without error')}")
                    continue
                first = next(iter(metrics.values()))
                if not isinstance(first, int | float) or isinstance(first, bool) or not math.isfinite(first):
                    parts.append(f"{name}: non-finite {first!r}")
                    continue
                scores.append(float(first))
            values.append(sum(scores) / len(scores) if scores and not parts else None)
            problems.append("; ".join(parts) or None)
        return values, problems

    def is_available(self) -> bool:
        resp = self.session.get(f"{self.base_url}/health", timeout=5)
        if resp.status_code != 200:
            return False
        body = resp.json()
        if not isinstance(body, dict) or not isinstance(body.get("rewards"), dict):
            raise ValueError(f"unexpected /health body {body!r}")
        missing = [n for n in self.required_rewards if n not in body["rewards"]]
        if missing:
            raise ValueError(f"required rewards {missing} not served")
        return True
