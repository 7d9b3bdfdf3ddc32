"""Contract lines 1-2 for every scorer kind (issue 38 item 6; docs/serve.md "Admission").

One real `rewardplane` server hosts every built-in kind (rules, the text reward models, CLIP and
PickScore on tiny random weights, the math and code verifiers, a judge against a fake
OpenAI-compatible endpoint, a composite); one request per kind carries, beside a good item, a
missing response, an empty and a blank one, lone UTF-16 surrogates in the prompt, the response and
a message, and empty message lists. Each answer is what the kind documents (`bad_input` at
admission, or its `empty_response` policy), the good item scores, and readiness stays 200.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from support.http_doubles import chat_completion, reply_json
from support.serve import LiveServer, jpeg_bytes, make_config

pytest.importorskip("math_verify")
pytest.importorskip("aiolimiter")

REFUSED, SCORED = "bad_input", "scored"
CASES = {
    "missing": {"prompt": "Say hello."},
    "empty": {"prompt": "Say hello.", "response": ""},
    "blank": {"prompt": "Say hello.", "response": "  \n\t"},
    "surrogate_prompt": {"prompt": "bad \ud800 prompt", "response": "Hello"},
    "surrogate_response": {"prompt": "Say hello.", "response": "bad \udfff"},
    "surrogate_message": {"prompt": [{"role": "user", "content": "bad \ud83d"}], "response": "Hello"},
    "empty_prompt_list": {"prompt": [], "response": "Hello"},
    "empty_response_list": {"prompt": "Say hello.", "response": []},
}
ENCODING = {c: REFUSED for c in CASES if c.startswith(("surrogate", "empty_"))}
"""Every kind refuses text that cannot be encoded (contract line 2)."""
RULE = {"missing": REFUSED, "empty": SCORED, "blank": SCORED, **ENCODING}
"""Rules and verifiers read the response; "" is scored by the rule (length 0, no answer: 0.0)."""
MODEL = {"missing": REFUSED, "empty": REFUSED, "blank": REFUSED, **ENCODING}
"""Scorers of text refuse an empty response (`empty_response: error`, their default)."""
IMAGE = {"missing": SCORED, "empty": SCORED, "blank": SCORED, **ENCODING}
"""Image scorers read the caption and the image, never the response."""

GOOD = {"prompt": "Say hello.", "response": "Hello there"}
CODE = "```python\nprint(input())\n```"
KINDS = {  # name: (spec, what each case gets, the good item, extra fields of every item)
    "exact_match": ({"kind": "exact_match"}, RULE, GOOD, {"reference": "Hello there"}),
    "regex": ({"kind": "regex", "options": {"pattern": "l"}}, RULE, GOOD, {}),
    "length": ({"kind": "length"}, RULE, GOOD, {}),
    "rm": ({"kind": "rm", "shape": "tiny-text-rm", "device": "cpu"}, MODEL, GOOD, {}),
    "hf_seqcls": ({"kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu"}, MODEL, GOOD, {}),
    "rm_fixed": (
        {"kind": "rm", "shape": "tiny-text-rm", "device": "cpu", "options": {"empty_response": -1.5}},
        {**MODEL, "empty": -1.5, "blank": -1.5},
        GOOD,
        {},
    ),
    "clip": ({"kind": "clip", "shape": "tiny-clip", "device": "cpu"}, IMAGE, GOOD, {"image": True}),
    "pickscore": ({"kind": "pickscore", "shape": "tiny-clip", "device": "cpu"}, IMAGE, GOOD, {"image": True}),
    "math": (
        {"kind": "math", "options": {"workers": 1}},
        RULE,
        {**GOOD, "response": "\\boxed{4}"},
        {"reference": "4"},
    ),
    "code": (
        {"kind": "code", "options": {"concurrency": 1}},
        RULE,
        {**GOOD, "response": CODE},
        {"reference": {"inputs": ["hi\n"], "outputs": ["hi\n"]}},
    ),
    "judge": ({"kind": "judge", "options": {"model": "fake-judge"}}, MODEL, GOOD, {}),
    "composite": (  # each component admits by its own contract; one refusal fails the item
        {
            "kind": "composite",
            "options": {
                "components": [
                    {"name": "len", "kind": "length"},
                    {"name": "rm", "kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu"},
                ]
            },
        },
        MODEL,
        GOOD,
        {},
    ),
}


class NineJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible judge that rates everything 9 (the judge must load and score)."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        reply_json(self, 200, chat_completion("Fine.\nScore: 9", body["model"]))


@pytest.fixture(scope="module")
def server():
    judge = ThreadingHTTPServer(("127.0.0.1", 0), NineJudge)
    judge.daemon_threads = True
    threading.Thread(target=judge.serve_forever, daemon=True).start()
    specs = []
    for name, (spec, *_rest) in KINDS.items():
        if spec["kind"] == "judge":
            spec = {
                **spec,
                "options": {**spec["options"], "url": f"http://127.0.0.1:{judge.server_address[1]}"},
            }
        specs.append({"name": name, "max_wait_ms": 1, **spec})
    specs.append({"name": "recording", "kind": "recording"})  # keeps every item it is handed
    try:
        with LiveServer(make_config(specs)) as live:
            yield live
    finally:
        judge.shutdown()


def request_items(good: dict, extra: dict) -> list[dict]:
    image = {"b64": base64.b64encode(jpeg_bytes()).decode()} if extra.get("image") else None
    fields = {k: v for k, v in extra.items() if k != "image"} | ({"image": image} if image else {})
    return [{"id": "good", **good, **fields}] + [
        {"id": case, **body, **fields} for case, body in CASES.items()
    ]


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_refuses_what_it_cannot_score_at_admission_and_scores_the_rest(server, name):
    _spec, expected, good, extra = KINDS[name]
    # a lone surrogate is valid JSON only as an escape: json.dumps writes it so (ensure_ascii)
    body = json.dumps({"scorers": [name], "items": request_items(good, extra)})
    r = httpx.post(
        server.url + "/v1/score", content=body, headers={"content-type": "application/json"}, timeout=60
    )
    assert r.status_code == 200, r.text
    results = {x["id"]: x for x in r.json()["results"]}
    assert isinstance(results["good"]["scores"].get(name), float), results["good"]
    got = {}
    for case in CASES:
        scores, errors = results[case]["scores"], results[case]["errors"]
        assert (name in scores) != (name in errors)  # a score or an error, never both
        if name in errors:
            got[case] = errors[name]["code"]
        else:
            got[case] = scores[name] if isinstance(expected[case], float) else SCORED
    assert got == expected
    if expected is RULE:  # "" by the rule: no length, no match, no answer
        assert results["empty"]["scores"][name] == 0.0
    ready = httpx.get(server.url + "/health/ready", timeout=10)
    assert ready.status_code == 200, ready.text


def test_refusals_name_the_reason_and_never_reach_a_batch(server):
    from support.serve import RecordingScorer

    RecordingScorer.seen.clear()
    body = json.dumps({"scorers": ["length", "recording"], "items": request_items(GOOD, {})})
    r = httpx.post(
        server.url + "/v1/score", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    errors = {x["id"]: x["errors"].get("length", {}).get("message") for x in r.json()["results"]}
    assert errors["missing"] == "missing response"
    assert errors["surrogate_response"] == "response is not valid Unicode (a lone UTF-16 surrogate)"
    assert errors["surrogate_message"] == "prompt[0] is not valid Unicode (a lone UTF-16 surrogate)"
    assert errors["empty_prompt_list"] == "prompt is an empty message list"
    # `recording` (a scorer of text) was handed the good item only: the refused ones never queued
    assert [item.id for item in RecordingScorer.seen] == ["good"]
