"""The `judge` scorer's in-process backend (`backend: transformers`) on CPU: a tiny Llama whose
greedy answer is scripted (`rewardplane.models.tiny.scripted_causal_lm`), so a real generated answer
is parsed; batching with left padding; the expectation over the model's own log-probabilities
against a plain transformers forward; unparseable answers; a random model; the options; and
one pass through a real server with offload/onload."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from rewardplane.core.errors import ConfigError
from rewardplane.data.builtin_tokenizer import build_tokenizer
from rewardplane.models.tiny import scripted_causal_lm, tiny_config
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.judge import JudgeScorer
from support.serve import LiveServer, make_config

CORPUS = [
    "You are a strict grader. Rate the quality of the response. Score: 7",
    "The answer is right because the sum telescopes. Nothing else to add.",
] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(CORPUS, vocab_size=400)


def generation_start(tok) -> int:
    """The last token of the chat template's generation prompt: where every answer starts."""
    text = tok.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    return tok(text, add_special_tokens=False)["input_ids"][-1]


def save_judge(directory, tok, answer: str | None, alternatives=None):
    """A judge model directory answering `answer` (None: a random tiny Llama that rambles)."""
    if answer is None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(
            tiny_config("tiny-llama", vocab_size=len(tok), eos_token_id=tok.eos_token_id)
        )
    else:
        script = [*tok(answer, add_special_tokens=False)["input_ids"], tok.eos_token_id]
        model = scripted_causal_lm(
            "tiny-llama", tok, script, start=generation_start(tok), alternatives=alternatives
        )
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def seven(tmp_path_factory, tokenizer):
    return save_judge(tmp_path_factory.mktemp("seven"), tokenizer, "Score:7")


def local(path: str, **options) -> JudgeScorer:
    s = JudgeScorer("j", options={"backend": "transformers", **options}, path=path, max_batch_size=2)
    s.load()
    return s


def item(response: str, i: str = "x", prompt: str = "What is 2 + 2?") -> ScoreItem:
    return ScoreItem(id=i, prompt=prompt, response=response)


def test_a_generated_answer_is_parsed_in_left_padded_batches(seven, tokenizer):
    s = local(seven, max_tokens=16)
    items = [
        item("4", "a"),
        item("It is four. " * 6, "b", prompt="Sum?"),
        item("2 + 2 = 4.", "c"),
        item("x", "d"),
    ]
    got = s.score_batch(items)
    assert got == [pytest.approx((7 - 1) / 9)] * 4  # 4 prompts of different lengths, 2 batches of 2
    script_len = len(tokenizer("Score:7", add_special_tokens=False)["input_ids"]) + 1
    assert s.info().extra["counters"] == {
        "prompts": 4,
        "generated_tokens": 4 * script_len,
        "unparseable": 0,
        "truncated": 0,
    }


def test_an_answer_without_a_score_is_unparseable_never_a_default(tmp_path, tokenizer):
    s = local(save_judge(tmp_path, tokenizer, "Nothing."), max_tokens=16)
    (got,) = s.score_batch([item("4")])
    assert isinstance(got, ItemError) and got.code == "judge_unparseable"
    assert s.info().extra["counters"]["unparseable"] == 1
    short = local(save_judge(tmp_path / "seven", tokenizer, "Score:7"), max_tokens=3)
    (cut,) = short.score_batch([item("4")])  # max_new_tokens stops it: never parsed
    assert isinstance(cut, ItemError) and cut.code == "judge_truncated"
    assert short.info().extra["counters"]["truncated"] == 1


def test_a_random_model_rambles_and_every_item_is_an_error_or_a_score_in_range(tmp_path, tokenizer):
    s = local(save_judge(tmp_path, tokenizer, None), max_tokens=8)
    got = s.score_batch([item(f"answer {i}", str(i)) for i in range(3)])
    assert all(
        (isinstance(g, ItemError) and g.code in ("judge_unparseable", "judge_truncated")) or 0 <= g <= 1
        for g in got
    )
    counters = s.info().extra["counters"]
    assert counters["prompts"] == 3 and 0 < counters["generated_tokens"] <= 3 * 8


def test_logprob_expectation_is_over_the_models_own_logits(tmp_path, tokenizer):
    """Runners-up at the rating step: 8 one logit below 7, 6 two below. The scorer's expectation
    must equal the one computed from a plain forward over the prompt and the answer so far."""
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prefix = ids("Score:")
    runners = [(ids("8")[0], 1.0), (ids("6")[0], 2.0)]
    path = save_judge(tmp_path, tokenizer, "Score:7", alternatives={len(prefix): runners})
    s = local(path, max_tokens=16, scale=[1, 9], score_from="logprobs", top_logprobs=5)
    (got,) = s.score_batch([item("4")])

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    prompt = s.engine.render(s._conversations(item("4"))[0])
    with torch.no_grad():
        logits = model(torch.tensor([prompt + prefix])).logits[0, -1]
    lp = torch.log_softmax(logits.float(), -1)
    digits = {d: float(lp[ids(str(d))[0]]) for d in range(1, 10)}
    p = {d: math.exp(v) for d, v in digits.items()}
    want = (sum(d * q for d, q in p.items()) / sum(p.values()) - 1) / 8
    assert got == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx(
        (7 + 8 * math.e**-1 + 6 * math.e**-2) / (1 + math.e**-1 + math.e**-2) / 8 - 1 / 8, abs=1e-4
    )


def test_options_are_checked(seven):
    with pytest.raises(ConfigError, match="path"):
        JudgeScorer("j", options={"backend": "transformers"})
    with pytest.raises(ConfigError, match="openai only"):
        JudgeScorer("j", options={"backend": "transformers", "url": "http://x", "deadline_s": 3}, path=seven)
    with pytest.raises(ConfigError, match="greedily"):
        JudgeScorer("j", options={"backend": "transformers", "temperature": 0.7}, path=seven)
    with pytest.raises(ConfigError, match="openai backend takes options.url"):
        JudgeScorer("j", options={"url": "http://x", "model": "m"}, path=seven)
    with pytest.raises(ConfigError, match="backend"):
        JudgeScorer("j", options={"backend": "vllm"})


def test_through_a_real_server_with_offload_and_onload(seven):
    spec = {
        "name": "judge",
        "kind": "judge",
        "path": seven,
        "device": "cpu",
        "max_batch_size": 4,
        "options": {"backend": "transformers", "max_tokens": 16},
    }
    with LiveServer(make_config([spec])) as server:
        items = [{"id": str(i), "prompt": "Hi", "response": "Hello" * (i + 1)} for i in range(3)]

        def post():
            r = httpx.post(server.url + "/v1/score", json={"scorers": ["judge"], "items": items}, timeout=60)
            assert r.status_code == 200, r.text
            return [x["scores"]["judge"] for x in r.json()["results"]]

        assert post() == [pytest.approx(6 / 9)] * 3
        info = next(
            x for x in httpx.get(server.url + "/v1/scorers").json()["scorers"] if x["name"] == "judge"
        )
        assert info["extra"]["backend"].startswith("transformers") and info["device"] == "cpu"
        off = httpx.post(server.url + "/v1/lifecycle/offload", params={"scorer": "judge"}, timeout=60).json()
        assert off["results"]["judge"]["transfer"]["bytes"] > 0
        assert (
            httpx.post(
                server.url + "/v1/lifecycle/onload", params={"scorer": "judge"}, timeout=60
            ).status_code
            == 200
        )
        assert post() == [pytest.approx(6 / 9)] * 3


@pytest.mark.gpu
def test_gpu_bf16_generates_the_same_answer_and_offloads(tmp_path, tokenizer):
    """On CUDA in bf16: the scripted answer parses to the same score, the logprob expectation
    matches the fp32 CPU one within bf16's precision, whichever attention kernel the GPU picks
    for the left-padded batch (each one SDPA has, in turn), and the weights leave the GPU on
    offload."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from rewardplane.serve.weights import weights_of

    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    alternatives = {len(ids("Score:")): [(ids("8")[0], 1.0)]}
    path = save_judge(tmp_path, tokenizer, "Score:7", alternatives=alternatives)
    options = {"backend": "transformers", "max_tokens": 16, "scale": [1, 9], "score_from": "logprobs"}
    gpu = JudgeScorer("g", options=options, path=path, dtype="bf16", device="cuda", max_batch_size=4)
    gpu.load()
    cpu = local(path, max_tokens=16, scale=[1, 9], score_from="logprobs")
    items = [item("4", "a"), item("It is four. " * 6, "b"), item("x", "c")]
    got, want = gpu.score_batch(items), cpu.score_batch(items)
    assert got == [pytest.approx(w, abs=2e-2) for w in want]
    # The default kernel differs between GPUs (and drivers): every one must give the answer.
    # Left padding leaves rows that attend to nothing, where kernels differ most.
    for backend in (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        with sdpa_kernel([backend]):
            assert gpu.score_batch(items) == [pytest.approx(w, abs=2e-2) for w in want], backend
    assert want[0] == pytest.approx((7 + 8 * math.e**-1) / (1 + math.e**-1) / 8 - 1 / 8, abs=1e-4)
    weights = weights_of(gpu)
    weights.offload()
    assert weights.bytes_on_device() == 0
    weights.onload()
    assert gpu.score_batch(items) == got
