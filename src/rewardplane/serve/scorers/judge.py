"""`judge` scorer: an LLM judge behind any OpenAI-compatible `/v1/chat/completions` endpoint
(vLLM, SGLang, TGI, `transformers serve`, a hosted API), or (`backend: transformers`) a local
causal LM generating in this process (`judge_transformers.py`), for small judges.

Pointwise: the judge rates the response on `scale` (default 1–10); the rating r maps to
(r - lo) / (hi - lo) in [0, 1]. Pairwise: the judge compares the response (A) with the item's
`reference` (B); A wins → 1.0, tie → 0.5, B wins → 0.0 (`both_orders: true` also asks with A and B
swapped and averages, against position bias).

The prompt, the response and the reference sit between tags the text inside cannot close, after
Unicode normalisation (`judge_prompts.fence`); the score is read from the judge's answer only,
never from what it was shown, and from one place only.

The verdict is read with a regex (`parse: regex`, `pattern` with one group: exactly one match on
the answer's final line), from the JSON object the answer ends with (`parse: json`, key `score`
or `winner`), or (`parse: structured`) from the one JSON object the engine was made to produce
with `response_format` (a JSON schema, which vLLM and SGLang enforce; `transformers serve`
accepts and ignores it, docs/verifiers.md). A
second distinct verdict anywhere in the answer (a judge that quotes the response's planted
`Score: 10` after its own), an answer that does not parse, a rating outside the scale, an empty
answer or a refusal (`finish_reason: content_filter`, a `refusal` field) is `judge_unparseable`;
an answer cut off at `max_tokens` (`finish_reason: length`) is `judge_truncated` and never
parsed — never a default score. Both are the item's own failures (docs/serve.md "Failure
kinds"). Requests run on one asyncio loop: at most `concurrency` in flight, a token bucket of
`rate_limit_rps` requests per second (aiolimiter), retries with exponential backoff and jitter on
429/5xx/connection errors (tenacity; a `Retry-After` header is honoured, capped), and a per-item
`deadline_s` covering every retry. An endpoint that keeps failing, or an item past its deadline,
is `judge_error`: the service's failure, not the item's.

`score_from: logprobs` (pointwise, a single-token integer scale such as [1, 5] or [1, 9]) scores
the expectation of the rating over the top log-probabilities at the rating's token instead of the
sampled rating; an endpoint without logprobs gives `judge_unparseable`, never a fallback.

Both backends share everything but the answering: the messages (`_conversations`), the templates
and parsers (`judge_prompts.py`: the tagged templates and `fence`; `parse_answer`,
`expected_score`, over the text and the endpoint-shaped logprobs) and the pairwise combination (`_combine`). The local backend generates greedily, so
its HTTP options (url, retries, limits, deadline) are refused there rather than silently
ignored. The options are `JudgeOptions` (docs/serve.md has the table).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
from typing import Any, ClassVar, Literal

import re2
from pydantic import Field, model_validator

from rewardplane.core.config import FieldError
from rewardplane.core.errors import ConfigError
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.common import as_text, json_config, resolve_device
from rewardplane.serve.scorers.judge_prompts import (
    DEFAULT_PATTERNS,
    INSTRUCTIONS,
    PAIRWISE_TEMPLATE,
    POINTWISE_TEMPLATE,
    Truncated,
    Unparseable,
    excerpt,
    expected_score,
    fence,
    parse_answer,
    response_format,
)
from rewardplane.serve.scorers.options import ScorerOptions

HTTP_LIMITS = frozenset(
    {
        "concurrency",
        "rate_limit_rps",
        "max_retries",
        "backoff_s",
        "max_backoff_s",
        "deadline_s",
        "request_timeout_s",
    }
)
"""The OpenAI-compatible backend's transport limits: refused with `backend: transformers`, and
not part of the identity (they decide when an item times out, never its score)."""


class Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Fatal(Exception):
    pass


class JudgeOptions(ScorerOptions):
    backend: Literal["openai", "transformers"] = "openai"
    """`openai`: an OpenAI-compatible `/v1/chat/completions` endpoint; `transformers`: a local
    causal LM in this process (the scorer's `path`), generating greedily."""
    url: str | None = None
    """openai: the endpoint's base URL (`/v1/chat/completions` is appended as needed); required there."""
    model: str | None = None
    """The model name sent with each request (required with openai; transformers: the directory's name)."""
    api_key_env: str | None = None
    """openai: the environment variable holding the API key (sent as a bearer token); it must be set."""
    trust_remote_code: bool = False
    """transformers: run Python code shipped in the model directory."""
    mode: Literal["pointwise", "pairwise"] = "pointwise"
    """`pointwise`: rate the response on `scale`; `pairwise`: compare it (A) with the item's
    `reference` (B): A wins 1.0, tie 0.5, B wins 0.0."""
    template: str | None = None
    """The user message, a `str.format` template (`{prompt}`, `{response}`, `{reference}`, `{a}`,
    `{b}`, `{lo}`, `{hi}`, `{reference_block}`); null: the built-in one for the mode."""
    system: str | None = None
    """A system message sent before the user message."""
    parse: Literal["regex", "json", "structured"] = "regex"
    """How the verdict is read, from one place only: the one match of `pattern` on the answer's
    final line; the `score` / `winner` of the JSON object the answer ends with; or (`structured`,
    openai backend) the field of the JSON object the engine produces under `response_format`."""
    pattern: str | None = None
    """regex: the pattern (RE2 syntax, linear time) with exactly one capture group; null: the built-in one for the mode."""
    scale: list[float] = Field(default_factory=lambda: [1.0, 10.0], min_length=2, max_length=2)
    """pointwise: [lo, hi], lo < hi; the rating r scores (r - lo) / (hi - lo)."""
    both_orders: bool = False
    """pairwise: also ask with A and B swapped and average (against position bias)."""
    max_tokens: int = Field(512, ge=1)
    """Tokens the judge may generate per answer."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature (transformers: must be 0, it generates greedily)."""
    score_from: Literal["text", "logprobs"] = "text"
    """`logprobs`: the expected rating over the top log-probabilities at the rating's token
    (pointwise, regex, an integer scale within 0..9), not the sampled rating."""
    top_logprobs: int = Field(20, ge=1)
    """score_from logprobs: the alternatives asked for at each token."""
    concurrency: int = Field(16, ge=1)
    """openai: requests in flight at once."""
    rate_limit_rps: float | None = Field(None, gt=0)
    """openai: requests per second (a token bucket); null: no limit."""
    max_retries: int = Field(4, ge=0)
    """openai: retries on 429, 5xx and connection errors (exponential backoff with jitter)."""
    backoff_s: float = Field(0.5, ge=0)
    """openai: the first retry's wait."""
    max_backoff_s: float = Field(20.0, ge=0)
    """openai: the longest wait between retries (and the cap on a `Retry-After`)."""
    deadline_s: float = Field(120.0, ge=1e-3)
    """openai: per item, every retry included; past it the item is `timeout`."""
    request_timeout_s: float = Field(60.0, ge=1e-3)
    """openai: per HTTP request."""

    not_in_identity: ClassVar[frozenset[str]] = HTTP_LIMITS | {"api_key_env", "trust_remote_code"}

    @model_validator(mode="after")
    def _rules(self) -> JudgeOptions:
        if self.backend == "openai":
            for key in ("url", "model"):
                if not getattr(self, key):
                    raise FieldError(key, "must be set with backend openai")
        else:
            http_only = sorted(self.model_fields_set & (HTTP_LIMITS | {"url", "api_key_env"}))
            if http_only:
                raise FieldError(http_only[0], "applies to backend openai only")
            if self.temperature != 0.0:
                raise FieldError("temperature", "must be 0 with backend transformers (it generates greedily)")
        lo, hi = self.scale
        if lo >= hi:
            raise FieldError("scale", f"must be [lo, hi] with lo < hi, got {self.scale}")
        if self.parse == "structured" and self.backend != "openai":
            raise FieldError(
                "parse", "structured needs backend openai (an engine that enforces response_format)"
            )
        try:
            pattern = self.compiled_pattern()
        except re2.error as exc:
            raise FieldError("pattern", f"is not RE2 syntax (linear-time matching): {exc}") from None
        if self.parse == "regex" and pattern.groups != 1:
            raise FieldError("pattern", "needs exactly one capture group")
        if self.score_from == "logprobs" and (
            self.mode != "pointwise"
            or self.parse != "regex"
            or not (0 <= lo < hi <= 9)
            or lo != int(lo)
            or hi != int(hi)
        ):
            raise FieldError(
                "score_from",
                "logprobs needs mode pointwise, parse regex and an integer scale within 0..9 (every rating one token)",
            )
        return self

    def compiled_pattern(self) -> Any:
        return re2.compile(self.pattern or DEFAULT_PATTERNS[self.mode])


class JudgeScorer(Scorer):
    """An LLM judge's rating (pointwise) or verdict (pairwise) for each item, asked of an
    OpenAI-compatible endpoint on the scorer's own asyncio loop, or of a local model in one
    batched generation (module docstring)."""

    kind: ClassVar[str] = "judge"
    modality: ClassVar = "text"
    lowest_score: ClassVar[float | None] = 0.0
    Options = JudgeOptions

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        o = self.options
        self.local = o.backend == "transformers"
        self.engine: Any = None
        self.model: Any = None  # backend transformers: the loaded LM, which the lifecycle moves
        if self.local:
            self.device = resolve_device(self.device)
            self.model_name = o.model or os.path.basename(os.path.normpath(self.path))
            self.url = ""
            self.counters = {"prompts": 0, "generated_tokens": 0, "unparseable": 0, "truncated": 0}
        else:
            self.model_name = o.model
            self.url = o.url.rstrip("/")
            if not self.url.endswith("/chat/completions"):
                self.url += "/chat/completions" if self.url.endswith("/v1") else "/v1/chat/completions"
            self.counters = {
                "requests": 0,
                "retries": 0,
                "unparseable": 0,
                "truncated": 0,
                "errors": 0,
                "timeouts": 0,
            }
        self.pattern, self.scale = o.compiled_pattern(), (o.scale[0], o.scale[1])
        self.template = o.template or (POINTWISE_TEMPLATE if o.mode == "pointwise" else PAIRWISE_TEMPLATE)
        self.api_key = os.environ.get(o.api_key_env) if o.api_key_env else None
        if o.api_key_env and not self.api_key:
            raise ConfigError(
                f"scorer {name!r} (judge): options.api_key_env names {o.api_key_env!r}, which is not set"
            )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        if spec.options.backend == "transformers" and not spec.path:
            raise FieldError("path", "must be set with backend transformers (a local model directory)")
        if spec.options.backend == "openai" and spec.path is not None:
            raise FieldError("path", "is for backend transformers; the openai backend takes options.url")

    # ------------------------------------------------------------------ lifecycle

    def load(self) -> None:
        if self.local:
            from rewardplane.serve.scorers.common import weights_digest
            from rewardplane.serve.scorers.judge_transformers import LocalJudgeModel

            self.engine = LocalJudgeModel(
                self.path,
                dtype=self.dtype,
                device=self.device,
                trust_remote_code=self.options.trust_remote_code,
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

        o = self.options

        async def setup() -> None:
            limits = httpx.Limits(max_connections=o.concurrency, max_keepalive_connections=o.concurrency)
            headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._http = httpx.AsyncClient(timeout=o.request_timeout_s, limits=limits, headers=headers)
            self._sem = asyncio.Semaphore(o.concurrency)
            rps = o.rate_limit_rps
            self._limiter = aiolimiter.AsyncLimiter(rps, 1.0) if rps is not None else None

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
        pairwise = self.options.mode == "pairwise"
        if pairwise and not ref_text:
            return ItemError(
                "bad_input", "pairwise judging needs the item's 'reference' (the answer to beat)"
            )
        first = self._messages(prompt, response, ref_text)
        if pairwise and self.options.both_orders:
            return [first, self._messages(prompt, ref_text, response)]
        return [first]

    def _combine(self, values: list[float]) -> float:
        """Pairwise with both orders: the average of A's view and the swapped answer's B view."""
        return values[0] if len(values) == 1 else (values[0] + (1.0 - values[1])) / 2

    def _parsed(self, text: str, logprobs: Any) -> float:
        """An answer → its score, by the configured parser; raises `Unparseable`."""
        o = self.options
        try:
            if o.score_from == "logprobs":
                return expected_score(text, logprobs, pattern=self.pattern, scale=self.scale)
            return parse_answer(text, mode=o.mode, parse=o.parse, pattern=self.pattern, scale=self.scale)
        except Unparseable as exc:  # the answer beside the reason: a wrong pattern shows at once
            raise Unparseable(f"{exc}; the judge answered {excerpt(text)}") from None

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
        instructions = INSTRUCTIONS[(self.options.mode, "regex" if self.options.parse == "regex" else "json")]
        content = self.template.format(**fields, instructions=instructions.format(lo=lo, hi=hi))
        system = self.options.system
        msgs = [{"role": "system", "content": system}] if system else []
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
        if choice.get("finish_reason") == "length":
            raise Truncated(f"the judge's answer was cut off at max_tokens={self.options.max_tokens}")
        if message.get("refusal") or choice.get("finish_reason") == "content_filter":
            raise Unparseable(f"the judge refused: {str(message.get('refusal') or 'content_filter')[:200]}")
        return message.get("content") or "", (choice.get("logprobs") or {}).get("content")

    async def _ask(self, messages: list[dict[str, str]]) -> float:
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

        o = self.options
        body = {
            "model": self.model_name,
            "messages": messages,
            "max_tokens": o.max_tokens,
            "temperature": o.temperature,
        }
        if o.score_from == "logprobs":
            body.update(logprobs=True, top_logprobs=o.top_logprobs)
        if o.parse == "structured":
            body["response_format"] = response_format(o.mode, self.scale)

        def wait(state: Any) -> float:
            exc = state.outcome.exception()
            backoff = min(o.max_backoff_s, o.backoff_s * 2 ** (state.attempt_number - 1))
            backoff *= 0.5 + random.random()  # jitter: retries of a rate-limited batch do not march in step
            if isinstance(exc, Retryable) and exc.retry_after is not None:
                backoff = max(backoff, min(exc.retry_after, o.max_backoff_s))
            self.counters["retries"] += 1
            return backoff

        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(o.max_retries + 1),
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
            async with asyncio.timeout(self.options.deadline_s):
                return self._combine([await self._ask(messages) for messages in conversations])
        except TimeoutError:  # the endpoint's slowness, not the item's: the service's failure
            self.counters["timeouts"] += 1
            return ItemError("judge_error", f"no judge answer within deadline_s={self.options.deadline_s:g}")
        except Truncated as exc:
            self.counters["truncated"] += 1
            return ItemError("judge_truncated", str(exc))
        except Unparseable as exc:
            self.counters["unparseable"] += 1
            return ItemError("judge_unparseable", str(exc)[:400])
        except (Retryable, Fatal) as exc:
            self.counters["errors"] += 1
            return ItemError("judge_error", f"judge endpoint failed: {exc}"[:300])

    async def _score_all(self, items: list[ScoreItem]) -> list[float | ItemError]:
        return list(await asyncio.gather(*(self._score_item(i) for i in items)))

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        if self.local:
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
                max_new_tokens=self.options.max_tokens,
                batch_size=self.max_batch_size,
                top_logprobs=self.options.top_logprobs if self.options.score_from == "logprobs" else None,
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
            if any(a.truncated for a in mine):
                self.counters["truncated"] += 1
                out.append(
                    ItemError("judge_truncated", f"the answer hit max_tokens={self.options.max_tokens}")
                )
                continue
            try:
                out.append(self._combine([self._parsed(a.text, a.logprobs) for a in mine]))
            except Unparseable as exc:
                self.counters["unparseable"] += 1
                out.append(ItemError("judge_unparseable", str(exc)[:400]))
        return out

    def warmup_item(self) -> ScoreItem:
        return ScoreItem(id="warmup", prompt="What is 2 + 2?", response="2 + 2 = 4.", reference="4")

    def placement(self) -> tuple[str, str]:
        return (self.dtype, self.device) if self.local else ("none", "remote")

    def identity_config(self) -> dict[str, Any]:
        if self.local and self.engine is not None:
            return json_config(self.engine.model.config)
        return {} if self.local else {"model": self.model_name}

    def info_extra(self) -> dict[str, Any]:
        o = self.options
        if self.local:
            limits: dict[str, Any] = {"max_new_tokens": o.max_tokens, "batch_size": self.max_batch_size}
            backend = {"backend": "transformers (in-process, greedy)", "path": self.path}
        else:
            limits = {
                k: getattr(o, k)
                for k in ("concurrency", "rate_limit_rps", "max_retries", "deadline_s", "request_timeout_s")
            }
            backend = {"backend": f"openai-compatible {self.url}"}
        return {**backend, "model": self.model_name, "counters": dict(self.counters), "limits": limits}
