"""`judge` scorer: an LLM judge behind any OpenAI-compatible `/v1/chat/completions` endpoint
(vLLM, SGLang, TGI, `transformers serve`, a hosted API), or (`backend: transformers`) a local
causal LM generating in this process (`judge_transformers.py`), for small judges.

Pointwise: the judge rates the response on `scale` (default 1–10); the rating r maps to
(r - lo) / (hi - lo) in [0, 1]. Pairwise: the judge compares the response (A) with the item's
`reference` (B); A wins → 1.0, tie → 0.5, B wins → 0.0 (`both_orders: true` also asks with A and B
swapped and averages, against position bias).

The prompt, the response and the reference sit between tags the text inside cannot close
(`judge_prompts.py`); the score is read from the judge's answer only, never from what it was shown.

The answer is parsed with a regex (`parse: regex`, `pattern` with one group; the last match wins)
or as JSON (`parse: json`, key `score` or `winner`; the last JSON object in the text). An answer
that does not parse, a rating outside the scale, an empty answer or a refusal
(`finish_reason: content_filter`, a `refusal` field) is `judge_unparseable` — never a default
score. Requests run on one asyncio loop: at most `concurrency` in flight, a token bucket of
`rate_limit_rps` requests per second (aiolimiter), retries with exponential backoff and jitter on
429/5xx/connection errors (tenacity; a `Retry-After` header is honoured, capped), and a per-item
`deadline_s` covering every retry (`timeout`). An endpoint that keeps failing is `judge_error`.

`score_from: logprobs` (pointwise, a single-token integer scale such as [1, 5] or [1, 9]) scores
the expectation of the rating over the top log-probabilities at the rating's token instead of the
sampled rating; an endpoint without logprobs gives `judge_unparseable`, never a fallback.

Both backends share everything but the answering: the messages (`_conversations`), the parsers
(`parse_answer`, `expected_score`, over the text and the endpoint-shaped logprobs) and the
pairwise combination (`_combine`). The local backend generates greedily, so its HTTP options
(url, retries, limits, deadline) are refused there rather than silently ignored.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import os
import random
import re
import threading
from typing import Any, ClassVar

from rewardplane.core.errors import ConfigError
from rewardplane.serve.scorers.base import ItemError, ScoreItem, ScorerInfo
from rewardplane.serve.scorers.common import VERSION, OptionsScorer, as_text, identity, json_config
from rewardplane.serve.scorers.judge_prompts import PAIRWISE_TEMPLATE, POINTWISE_TEMPLATE, fence

DEFAULT_PATTERNS = {
    "pointwise": r"(?i)score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)",
    "pairwise": r"\[\[\s*(A|B|TIE)\s*\]\]",
}
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
BACKENDS = ("openai", "transformers")
HTTP_OPTIONS = frozenset(
    {
        "url",
        "api_key_env",
        "concurrency",
        "rate_limit_rps",
        "max_retries",
        "backoff_s",
        "max_backoff_s",
        "deadline_s",
        "request_timeout_s",
    }
)
"""Options of the OpenAI-compatible backend only: refused with `backend: transformers`."""


class Unparseable(Exception):
    pass


class Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Fatal(Exception):
    pass


def parse_answer(
    text: str, *, mode: str, parse: str, pattern: re.Pattern[str], scale: tuple[float, float]
) -> float:
    """The judge's answer → a score in [0, 1] (pointwise) or {0, 0.5, 1} (pairwise, A's view)."""
    if not text or not text.strip():
        raise Unparseable("empty answer")
    if parse == "json":
        raw: Any = None
        for candidate in reversed(_JSON_OBJECT.findall(text)):
            try:
                obj = json.loads(candidate)
            except ValueError:
                continue
            key = "score" if mode == "pointwise" else "winner"
            if isinstance(obj, dict) and key in obj:
                raw = obj[key]
                break
        if raw is None:
            raise Unparseable("no JSON object with the expected key")
    else:
        matches = pattern.findall(text)
        if not matches:
            raise Unparseable(f"no match for {pattern.pattern!r}")
        raw = matches[-1]
    if mode == "pairwise":
        verdict = str(raw).strip().upper()
        if verdict not in ("A", "B", "TIE"):
            raise Unparseable(f"verdict {raw!r} is not A, B or TIE")
        return {"A": 1.0, "B": 0.0, "TIE": 0.5}[verdict]
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise Unparseable(f"score {raw!r} is not a number") from None
    lo, hi = scale
    if not lo <= value <= hi:
        raise Unparseable(f"score {value:g} is outside the scale {lo:g}..{hi:g}")
    return (value - lo) / (hi - lo)


def expected_score(
    text: str, logprobs: Any, *, pattern: re.Pattern[str], scale: tuple[float, float]
) -> float:
    """The expectation of the rating over the judge's token probabilities at the rating's position
    (G-Eval style), mapped to [0, 1]. The rating must be readable in the text (the regex's last
    match) and its token must carry `top_logprobs`; only single-token integer ratings inside the
    scale count, renormalised over themselves."""
    import math

    matches = list(pattern.finditer(text or ""))
    if not matches:
        raise Unparseable(f"no match for {pattern.pattern!r}")
    start = matches[-1].start(1)
    if not isinstance(logprobs, list) or not logprobs:
        raise Unparseable("the endpoint returned no logprobs (does it support logprobs/top_logprobs?)")
    tokens = [t.get("token", "") if isinstance(t, dict) else "" for t in logprobs]
    if "".join(tokens) != text:
        raise Unparseable("the logprobs' tokens do not spell the answer's text")
    ends = list(itertools.accumulate(len(t) for t in tokens))
    entry = logprobs[bisect.bisect_right(ends, start)]  # the token holding the rating's first char
    lo, hi = scale
    mass = weighted = 0.0
    for cand in entry.get("top_logprobs") or []:
        word = str(cand.get("token", "")).strip()
        if word.isdigit() and lo <= int(word) <= hi and isinstance(cand.get("logprob"), int | float):
            p = math.exp(cand["logprob"])
            mass += p
            weighted += p * int(word)
    if mass <= 0.0:
        raise Unparseable("no rating inside the scale among the top logprobs at the rating's token")
    return (weighted / mass - lo) / (hi - lo)


class JudgeScorer(OptionsScorer):
    kind: ClassVar[str] = "judge"
    modality: ClassVar = "text"
    allowed_options: ClassVar[frozenset[str]] = frozenset(
        {
            "backend",
            "trust_remote_code",
            "model",
            "mode",
            "template",
            "system",
            "parse",
            "pattern",
            "scale",
            "both_orders",
            "max_tokens",
            "temperature",
            "score_from",
            "top_logprobs",
        }
        | HTTP_OPTIONS
    )

    def __init__(
        self,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        max_batch_size: int = 256,
        max_wait_ms: float = 10.0,
        path: str | None = None,
        dtype: str = "fp32",
        device: str = "cpu",
    ) -> None:
        super().__init__(name, options=options, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        o = self.options
        where = f"scorer {name!r} (judge)"
        self.backend = o.get("backend", "openai")
        if self.backend not in BACKENDS:
            raise ConfigError(f"{where}: options.backend must be one of {BACKENDS}")
        self.path, self.dtype, self.device = path, dtype, device
        self.engine: Any = None
        self.model: Any = None  # backend transformers: the loaded LM, which the lifecycle moves
        self._weights = ""
        if self.backend == "transformers":
            if not path:
                raise ConfigError(
                    f"{where}: backend transformers needs the scorer's path (a local model directory)"
                )
            http_only = sorted(set(o) & HTTP_OPTIONS)
            if http_only:
                raise ConfigError(f"{where}: options {http_only} apply to backend openai only")
            if o.get("temperature", 0.0) != 0.0:
                raise ConfigError(f"{where}: backend transformers generates greedily: temperature must be 0")
            o.setdefault("model", os.path.basename(os.path.normpath(path)))
            self.url = ""
        else:
            if path is not None:
                raise ConfigError(
                    f"{where}: path is for backend transformers; the openai backend takes options.url"
                )
            for key in ("url", "model"):
                if not isinstance(o.get(key), str) or not o[key]:
                    raise ConfigError(f"{where}: options.{key} (a string) is required")
            self.url = o["url"].rstrip("/")
            if not self.url.endswith("/chat/completions"):
                self.url += "/chat/completions" if self.url.endswith("/v1") else "/v1/chat/completions"
        self.mode = o.get("mode", "pointwise")
        if self.mode not in ("pointwise", "pairwise"):
            raise ConfigError(f"{where}: options.mode must be pointwise or pairwise")
        self.parse = o.get("parse", "regex")
        if self.parse not in ("regex", "json"):
            raise ConfigError(f"{where}: options.parse must be regex or json")
        try:
            self.pattern = re.compile(o.get("pattern", DEFAULT_PATTERNS[self.mode]))
        except re.error as exc:
            raise ConfigError(f"{where}: bad options.pattern: {exc}") from None
        if self.parse == "regex" and self.pattern.groups != 1:
            raise ConfigError(f"{where}: options.pattern needs exactly one capture group")
        scale = o.get("scale", [1, 10])
        if (
            not isinstance(scale, list | tuple)
            or len(scale) != 2
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in scale)
            or scale[0] >= scale[1]
        ):
            raise ConfigError(f"{where}: options.scale must be [lo, hi] with lo < hi")
        self.scale = (float(scale[0]), float(scale[1]))
        self.template = o.get(
            "template", POINTWISE_TEMPLATE if self.mode == "pointwise" else PAIRWISE_TEMPLATE
        )
        if not isinstance(self.template, str):
            raise ConfigError(f"{where}: options.template must be a string")
        api_env = o.get("api_key_env")
        self.api_key = os.environ.get(api_env) if api_env else None
        if api_env and not self.api_key:
            raise ConfigError(f"{where}: options.api_key_env names {api_env!r}, which is not set")

        def num(key: str, default: float, lo: float = 0.0) -> float:
            v = o.get(key, default)
            if not isinstance(v, int | float) or isinstance(v, bool) or v < lo:
                raise ConfigError(f"{where}: options.{key} must be a number >= {lo}")
            return float(v)

        self.concurrency = int(num("concurrency", 16, 1))
        self.rate_limit_rps = o.get("rate_limit_rps")
        if self.rate_limit_rps is not None:
            num("rate_limit_rps", 1, 1e-6)
        self.max_retries = int(num("max_retries", 4))
        self.backoff_s = num("backoff_s", 0.5)
        self.max_backoff_s = num("max_backoff_s", 20.0)
        self.deadline_s = num("deadline_s", 120.0, 1e-3)
        self.request_timeout_s = num("request_timeout_s", 60.0, 1e-3)
        self.max_tokens = int(num("max_tokens", 512, 1))
        self.temperature = num("temperature", 0.0)
        self.both_orders = bool(o.get("both_orders", False))
        self.score_from = o.get("score_from", "text")
        if self.score_from not in ("text", "logprobs"):
            raise ConfigError(f"{where}: options.score_from must be text or logprobs")
        self.top_logprobs = int(num("top_logprobs", 20, 1))
        if self.score_from == "logprobs" and (
            self.mode != "pointwise"
            or self.parse != "regex"
            or not (0 <= self.scale[0] < self.scale[1] <= 9)
            or self.scale != (int(self.scale[0]), int(self.scale[1]))
        ):
            raise ConfigError(
                f"{where}: score_from: logprobs needs mode pointwise, parse regex and an integer scale "
                "within 0..9 (every rating one token)"
            )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.counters = {"requests": 0, "retries": 0, "unparseable": 0, "errors": 0, "timeouts": 0}
        if self.backend == "transformers":
            self.counters = {"prompts": 0, "generated_tokens": 0, "unparseable": 0}

    @classmethod
    def from_spec(cls, spec: Any) -> JudgeScorer:
        backend = (spec.options or {}).get("backend", "openai")
        local = {"dtype": spec.dtype, "device": spec.resolved_device()} if backend == "transformers" else {}
        return cls(
            spec.name,
            options=spec.options,
            max_batch_size=spec.max_batch_size,
            max_wait_ms=spec.max_wait_ms,
            path=spec.path,
            **local,
        )

    # ------------------------------------------------------------------ lifecycle

    def load(self) -> None:
        if self.backend == "transformers":
            from rewardplane.serve.scorers.common import weights_digest
            from rewardplane.serve.scorers.judge_transformers import LocalJudgeModel

            self.engine = LocalJudgeModel(
                self.path,
                dtype=self.dtype,
                device=self.device,
                trust_remote_code=bool(self.options.get("trust_remote_code", False)),
            )
            self.model = self.engine.model  # what the lifecycle offloads and onloads
            self._weights = weights_digest(self.path)
            return
        try:
            import aiolimiter
            import httpx
            import tenacity  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"scorer {self.name!r} (judge) needs aiolimiter and tenacity: pip install 'rewardplane[verifiers]'"
            ) from None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"judge-{self.name}")
        self._thread.start()

        async def setup() -> None:
            limits = httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            )
            headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._http = httpx.AsyncClient(timeout=self.request_timeout_s, limits=limits, headers=headers)
            self._sem = asyncio.Semaphore(self.concurrency)
            self._limiter = (
                aiolimiter.AsyncLimiter(float(self.rate_limit_rps), 1.0)
                if self.rate_limit_rps is not None
                else None
            )

        asyncio.run_coroutine_threadsafe(setup(), self._loop).result()

    def close(self) -> None:
        self.engine = self.model = None
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._http.aclose(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None

    # ------------------------------------------------------------------ requests

    def _conversations(self, item: ScoreItem) -> list[list[dict[str, str]]] | ItemError:
        """The messages to ask for one item: one conversation, or (pairwise with `both_orders`)
        the original and the swapped one, in that order."""
        prompt, response = as_text(item.prompt), as_text(item.response)
        ref = item.reference
        ref_text = ref if isinstance(ref, str) or ref is None else json.dumps(ref)
        if self.mode == "pairwise" and not ref_text:
            return ItemError(
                "bad_input", "pairwise judging needs the item's 'reference' (the answer to beat)"
            )
        first = self._messages(prompt, response, ref_text)
        if self.mode == "pairwise" and self.both_orders:
            return [first, self._messages(prompt, ref_text, response)]
        return [first]

    def _combine(self, values: list[float]) -> float:
        """Pairwise with both orders: the average of A's view and the swapped answer's B view."""
        return values[0] if len(values) == 1 else (values[0] + (1.0 - values[1])) / 2

    def _parsed(self, text: str, logprobs: Any) -> float:
        """An answer → its score, by the configured parser; raises `Unparseable`."""
        if self.score_from == "logprobs":
            return expected_score(text, logprobs, pattern=self.pattern, scale=self.scale)
        return parse_answer(text, mode=self.mode, parse=self.parse, pattern=self.pattern, scale=self.scale)

    def _messages(self, prompt: str, a: str, b: str | None) -> list[dict[str, str]]:
        lo, hi = (f"{x:g}" for x in self.scale)
        prompt, a, b = fence(prompt), fence(a), fence(b) if b else b
        fields = {
            "prompt": prompt,
            "response": a,
            "reference": b or "",
            "a": a,
            "b": b or "",
            "lo": lo,
            "hi": hi,
            "reference_block": f"\n<reference>\n{b}\n</reference>\n" if b else "",
        }
        content = self.template.format(**fields)
        msgs = [{"role": "system", "content": self.options["system"]}] if self.options.get("system") else []
        return [*msgs, {"role": "user", "content": content}]

    async def _post_once(self, body: dict[str, Any]) -> tuple[str, Any]:
        import httpx

        self.counters["requests"] += 1
        try:
            r = await self._http.post(self.url, json=body)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}") from None
        if r.status_code == 429 or r.status_code >= 500:
            retry_after = r.headers.get("retry-after")
            try:
                wait = float(retry_after) if retry_after is not None else None
            except ValueError:
                wait = None
            raise Retryable(f"HTTP {r.status_code}", wait)
        if r.status_code != 200:
            raise Fatal(f"HTTP {r.status_code}: {r.text[:200]}")
        try:
            choice = r.json()["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise Unparseable("the endpoint's answer is not a chat completion") from None
        if message.get("refusal") or choice.get("finish_reason") == "content_filter":
            raise Unparseable(f"the judge refused: {str(message.get('refusal') or 'content_filter')[:200]}")
        return message.get("content") or "", (choice.get("logprobs") or {}).get("content")

    async def _ask(self, messages: list[dict[str, str]]) -> float:
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

        body = {
            "model": self.options["model"],
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.score_from == "logprobs":
            body.update(logprobs=True, top_logprobs=self.top_logprobs)

        def wait(state: Any) -> float:
            exc = state.outcome.exception()
            backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (state.attempt_number - 1))
            backoff *= 0.5 + random.random()  # jitter: retries of a rate-limited batch do not march in step
            if isinstance(exc, Retryable) and exc.retry_after is not None:
                backoff = max(backoff, min(exc.retry_after, self.max_backoff_s))
            self.counters["retries"] += 1
            return backoff

        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait,
            retry=retry_if_exception_type(Retryable),
            reraise=True,
        ):
            with attempt:
                async with self._sem:
                    if self._limiter is not None:
                        await self._limiter.acquire()
                    text, logprobs = await self._post_once(body)
        return self._parsed(text, logprobs)

    async def _score_item(self, item: ScoreItem) -> float | ItemError:
        conversations = self._conversations(item)
        if isinstance(conversations, ItemError):
            return conversations
        try:
            async with asyncio.timeout(self.deadline_s):
                return self._combine([await self._ask(messages) for messages in conversations])
        except TimeoutError:
            self.counters["timeouts"] += 1
            return ItemError("timeout", f"no parsed judge answer within deadline_s={self.deadline_s:g}")
        except Unparseable as exc:
            self.counters["unparseable"] += 1
            return ItemError("judge_unparseable", str(exc)[:300])
        except (Retryable, Fatal) as exc:
            self.counters["errors"] += 1
            return ItemError("judge_error", f"judge endpoint failed: {exc}"[:300])

    async def _score_all(self, items: list[ScoreItem]) -> list[float | ItemError]:
        return list(await asyncio.gather(*(self._score_item(i) for i in items)))

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        if self.backend == "transformers":
            return self._score_local(items)
        assert self._loop is not None, "load() first"
        return asyncio.run_coroutine_threadsafe(self._score_all(items), self._loop).result()

    def _score_local(self, items: list[ScoreItem]) -> list[float | ItemError]:
        """Every conversation of the batch generated together, then parsed as the endpoint's."""
        assert self.engine is not None, "load() first"
        asked = [self._conversations(item) for item in items]
        prompts = [
            self.engine.render(m) for convs in asked if not isinstance(convs, ItemError) for m in convs
        ]
        answers = iter(
            self.engine.generate(
                prompts,
                max_new_tokens=self.max_tokens,
                batch_size=self.max_batch_size,
                top_logprobs=self.top_logprobs if self.score_from == "logprobs" else None,
            )
            if prompts
            else []
        )
        self.counters["prompts"] += len(prompts)
        out: list[float | ItemError] = []
        for convs in asked:
            if isinstance(convs, ItemError):
                out.append(convs)
                continue
            mine = [next(answers) for _ in convs]
            self.counters["generated_tokens"] += sum(a.tokens for a in mine)
            try:
                out.append(self._combine([self._parsed(a.text, a.logprobs) for a in mine]))
            except Unparseable as exc:
                self.counters["unparseable"] += 1
                out.append(ItemError("judge_unparseable", str(exc)[:300]))
        return out

    def warmup_item(self) -> ScoreItem:
        return ScoreItem(id="warmup", prompt="What is 2 + 2?", response="2 + 2 = 4.", reference="4")

    def info(self) -> ScorerInfo:
        o = self.options
        public = {k: v for k, v in o.items() if k not in ("api_key_env", "trust_remote_code")}
        extra: dict[str, Any] = {
            "model": o["model"],
            "mode": self.mode,
            "parse": self.parse,
            "score_from": self.score_from,
            "scale": list(self.scale),
            "counters": dict(self.counters),
        }
        if self.backend == "transformers":
            model = self.engine.model if self.engine is not None else None
            weights, config = self._weights, json_config(model.config) if model is not None else {}
            dtype, device = self.dtype, self.device
            extra = {"backend": "transformers (in-process, greedy)", "path": self.path, **extra}
            extra["limits"] = {"max_new_tokens": self.max_tokens, "batch_size": self.max_batch_size}
        else:
            weights, config, dtype, device = "", {"model": o["model"]}, "none", "remote"
            extra = {"backend": f"openai-compatible {self.url}", **extra}
            extra["limits"] = {
                "concurrency": self.concurrency,
                "rate_limit_rps": self.rate_limit_rps,
                "max_retries": self.max_retries,
                "deadline_s": self.deadline_s,
                "request_timeout_s": self.request_timeout_s,
            }
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype=dtype,
            device=device,
            version=VERSION,
            identity=identity(kind=self.kind, weights=weights, config=config, dtype=dtype, options=public),
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            extra=extra,
        )
