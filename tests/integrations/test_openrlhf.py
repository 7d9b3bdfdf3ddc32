"""OpenRLHF 0.11: its single-turn agent executor (`openrlhf.utils.agent.SingleTurnAgentExecutor`,
what `--reward.remote_url` drives) fetches rewards from `POST /get_reward` of a live server.

The executor is built as `train_ppo_ray` builds it: from `args.reward.remote_url` after
OpenRLHF's own command-line parser and checks (`ppo_args`), so the flag docs/integrations.md
gives is the one OpenRLHF accepts."""

from __future__ import annotations

import argparse
import ast
import asyncio
import functools
import re
import shlex
import sys
import types
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from rewardplane.data.builtin_tokenizer import build_tokenizer
from rewardplane.serve.routes.openrlhf import strip_eos

agent = pytest.importorskip("openrlhf.utils.agent")
DOCS = Path(__file__).resolve().parents[2] / "docs"

PROMPT = "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["Say hello.", "Hello there, friend!", "NAN"] * 10, vocab_size=300)


class FakeEngine:
    """Stands in for the vLLM engine: 'generates' a fixed continuation (token ids + text)."""

    def __init__(self, tokenizer, text: str, *, eos: bool = True) -> None:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        self.ids = [*ids, tokenizer.convert_tokens_to_ids("<|im_end|>")] if eos else ids
        self.text = tokenizer.decode(self.ids, skip_special_tokens=True)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        out = types.SimpleNamespace(token_ids=self.ids, text=self.text, finish_reason="stop", logprobs=None)
        return types.SimpleNamespace(outputs=[out])


@functools.cache
def _ppo_main():
    """The `if __name__ == "__main__":` block of the installed `openrlhf/cli/train_ppo_ray.py`
    (its argparse parser, `hierarchize` and its argument checks, then `train(args)`), compiled
    from OpenRLHF's source: the module itself cannot be imported on CPU (its Ray actors import
    vLLM), but this block needs only argparse and datetime."""
    import openrlhf

    path = Path(openrlhf.__file__).parent / "cli" / "train_ppo_ray.py"
    tree = ast.parse(path.read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    )
    return compile(ast.Module(body=block.body, type_ignores=[]), str(path), "exec")


def ppo_args(argv: list[str]) -> types.SimpleNamespace:
    """What `python -m openrlhf.cli.train_ppo_ray *argv` hands to `train(args)`."""
    captured: list = []
    saved = sys.argv
    sys.argv = ["train_ppo_ray.py", *argv]
    try:
        exec(
            _ppo_main(),
            {"__name__": "__main__", "argparse": argparse, "datetime": datetime, "train": captured.append},
        )
    finally:
        sys.argv = saved
    return captured[0]


def run_executor(url: str, tokenizer, response: str, *, label=None, prompt: str = PROMPT) -> dict:
    # train_ppo_ray: create_vllm_engines(remote_rm_url=args.reward.remote_url) -> SingleTurnAgentExecutor
    executor = agent.SingleTurnAgentExecutor(ppo_args(["--reward.remote_url", url]).reward.remote_url)
    params = types.SimpleNamespace(max_tokens=16, logprobs=None)
    return asyncio.run(
        executor.execute(prompt, label, params, 256, tokenizer, FakeEngine(tokenizer, response))
    )


def query_of(output: dict, tokenizer) -> str:
    return tokenizer.decode(output["observation_tokens"], skip_special_tokens=False)


@pytest.mark.parametrize("scorer", ["len", "rm"])
def test_raw_mode_scores_the_query_as_given(server, direct_scores, tokenizer, scorer):
    out = run_executor(f"{server.url}/get_reward?scorer={scorer}", tokenizer, "Hello there, friend!")
    query = query_of(out, tokenizer)
    assert query.startswith(PROMPT) and query.endswith("<|im_end|>")
    if scorer == "rm":  # as OpenRLHF's own RM server: the query's tokens as given, no template
        want = plain_forward_of_the_served_rm(query)
    else:
        want = direct_scores(server.url, scorer, [{"id": "0", "prompt": "", "response": query}])[0]
    assert (
        out["scores"] == [pytest.approx(want, abs=1e-5)] and out["reward"] == out["scores"]
    )  # one per query
    assert out["extra_logs"] == {scorer: [pytest.approx(want, abs=1e-5)]}


def plain_forward_of_the_served_rm(text: str) -> float:
    """The served `rm` (tiny-text-rm, seed 0) rebuilt in-process, scored by a plain transformers
    forward of `text` tokenised as given (its last token is where the reward is read)."""
    import torch

    from rewardplane.serve.scorers.text import SeqClsScorer

    twin = SeqClsScorer("rm", shape="tiny-text-rm")
    twin.load()
    ids = twin.tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return float(twin.model(input_ids=torch.tensor([ids])).logits[0, 0])


@pytest.fixture(scope="module")
def template_end_server(tmp_path_factory):
    """A reward model trained (one step, tiny) on the built-in ChatML tokenizer: its checkpoint
    records `score_position: template_end`, so it was trained to be read after ChatML's "\n"."""
    from rewardplane.data.synth import builtin_tokenizer
    from support.rm import train_tiny_checkpoint
    from support.serve import LiveServer, make_config

    checkpoint = str(train_tiny_checkpoint(tmp_path_factory.mktemp("template_end"), builtin_tokenizer()))
    spec = {"kind": "rm", "path": checkpoint, "device": "cpu", "max_wait_ms": 1}
    as_given = {**spec, "name": "rm_as_given", "options": {"complete_turn": False}}
    with LiveServer(make_config([{**spec, "name": "rm"}, as_given])) as live:
        yield live


def test_raw_mode_reads_a_template_end_checkpoint_where_v1_score_does(
    template_end_server, direct_scores, tokenizer
):
    """Issue 38 item 5: the policy's sequence stops at `<|im_end|>`; the checkpoint was trained at
    the template's end (the newline after it). `complete_turn` (on: the checkpoint records
    template_end) appends the newline, so a raw ChatML query scores what `/v1/score` gives the same
    conversation; read as given (OpenRLHF's own server, `complete_turn: false`) it is one token
    early and scores differently (the issue measured -2.41 against -1.22 on the demo RM)."""
    url = template_end_server.url
    out = run_executor(f"{url}/get_reward?scorer=rm", tokenizer, "Hello there, friend!")
    assert query_of(out, tokenizer).endswith("<|im_end|>")
    conversation = {
        "id": "0",
        "prompt": [{"role": "user", "content": "Say hello."}],
        "response": [{"role": "assistant", "content": "Hello there, friend!"}],
    }
    want = direct_scores(url, "rm", [conversation])[0]
    assert out["scores"] == [pytest.approx(want, abs=1e-5)]
    early = run_executor(f"{url}/get_reward?scorer=rm_as_given", tokenizer, "Hello there, friend!")
    assert abs(early["scores"][0] - want) > 1e-3
    extra = {s["name"]: s["extra"] for s in httpx.get(f"{url}/v1/scorers").json()["scorers"]}
    assert extra["rm"]["complete_turn"] is True and extra["rm_as_given"]["complete_turn"] is False


def test_split_mode_rerenders_prompt_and_response_for_the_scorer(server, direct_scores, tokenizer):
    out = run_executor(f"{server.url}/get_reward?scorer=rm&mode=split", tokenizer, "Hello there, friend!")
    query = query_of(out, tokenizer)
    response = strip_eos(query[len(PROMPT) :])
    assert response == "Hello there, friend!"
    want = direct_scores(server.url, "rm", [{"id": "0", "prompt": PROMPT, "response": response}])[0]
    assert out["scores"] == [pytest.approx(want, abs=1e-5)]


def test_labels_are_the_reference(server, tokenizer):
    out = run_executor(
        f"{server.url}/get_reward?scorer=exact&mode=split",
        tokenizer,
        "Hello there, friend!",
        label="hello there, friend!",
    )
    assert out["scores"] == [1.0]


def test_default_scorer_is_the_first_configured(server, direct_scores, tokenizer):
    out = run_executor(f"{server.url}/get_reward", tokenizer, "Hello there, friend!")
    query = query_of(out, tokenizer)
    assert out["scores"] == [pytest.approx(plain_forward_of_the_served_rm(query), abs=1e-5)]


def test_a_failed_item_fails_the_request_and_openrlhf_gets_no_number(server, tokenizer, monkeypatch):
    r = httpx.post(
        f"{server.url}/get_reward?scorer=double",
        json={"query": ["ok", "NAN"], "prompts": ["", ""], "labels": [None, None]},
    )
    assert r.status_code == 500 and r.json()["code"] == "non_finite" and "query 1" in r.json()["message"]
    r = httpx.post(
        f"{server.url}/get_reward?scorer=rm&mode=split",
        json={"query": ["cut prompt"], "prompts": ["full prompt"]},
    )
    assert r.status_code == 422 and r.json()["code"] == "bad_input"

    real_sleep = asyncio.sleep
    monkeypatch.setattr(agent.asyncio, "sleep", lambda s, *a: real_sleep(0))  # OpenRLHF waits 1 s per retry
    executor = agent.SingleTurnAgentExecutor(f"{server.url}/get_reward?scorer=double")
    with pytest.raises(RuntimeError, match="5 times"):
        asyncio.run(executor._fetch_rewards_via_http(["NAN"], [""], [None]))
    out = run_executor(f"{server.url}/get_reward?scorer=double", tokenizer, "NAN")
    assert out["reward"] is None and out["scores"] is None  # OpenRLHF's own "no reward", never a number


def test_request_errors(server):
    assert (
        httpx.post(f"{server.url}/get_reward?scorer=nope", json={"query": ["x"]}).json()["code"]
        == "unknown_scorer"
    )
    r = httpx.post(f"{server.url}/get_reward", json={"query": ["x"], "prompts": []})
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"
    assert httpx.post(f"{server.url}/get_reward?mode=other", json={"query": ["x"]}).status_code == 422


def test_the_documented_flags_are_the_ones_openrlhf_0_11_parses(capsys):
    """Every `--reward.remote_url ...` line of docs/integrations.md goes through OpenRLHF's own
    parser to the list the executor takes; the colocation flags docs/lifecycle.md names exist;
    the pre-0.11 `--remote_rm_url` is refused by 0.11's parser."""
    text = (DOCS / "integrations.md").read_text()
    lines = re.findall(r"^--reward\.remote_url .+$", text, flags=re.M)
    assert len(lines) >= 3
    for line in lines:
        argv = shlex.split(line)
        assert ppo_args(argv).reward.remote_url == [argv[1]]
    lifecycle = (DOCS / "lifecycle.md").read_text()
    flags = ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    assert all(f"`{flag}" in lifecycle or f" {flag}" in lifecycle for flag in flags)
    args = ppo_args([*flags, "--reward.remote_url", "http://h:8000/get_reward"])
    assert args.train.colocate_all and args.vllm.enable_sleep and args.ds.enable_sleep
    with pytest.raises(SystemExit) as exit_info:
        ppo_args(["--remote_rm_url", "http://h:8000/get_reward"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --remote_rm_url" in capsys.readouterr().err


def test_a_composites_components_reach_openrlhfs_extra_logs(
    server, direct_scores, direct_components, tokenizer
):
    """Issue 38 item 4: OpenRLHF logs `extra_logs`; a composite's answer carries each component
    (`<name>/<component>`) next to the total, the same keys in every answer (OpenRLHF stacks them)."""
    out = run_executor(f"{server.url}/get_reward?scorer=reward&mode=split", tokenizer, "Hello there, friend!")
    item = {"id": "0", "prompt": PROMPT, "response": "Hello there, friend!"}
    total, parts = (
        direct_scores(server.url, "reward", [item])[0],
        direct_components(server.url, "reward", [item])[0],
    )
    assert out["scores"] == [pytest.approx(total, abs=1e-5)]
    assert set(out["extra_logs"]) == {"reward", "reward/model", "reward/length"}
    assert out["extra_logs"]["reward/model"] == [pytest.approx(parts["model"], abs=1e-5)]
    assert out["extra_logs"]["reward/length"] == [parts["length"]]
    # renormalize: a left-out component has no number, so the count left out is logged instead
    r = httpx.post(f"{server.url}/get_reward?scorer=lenient", json={"query": ["abcd", "NAN!"]})
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [12.0, 12.0] and r.json()["extra_logs"]["lenient/left_out"] == [0.0, 1.0]
    assert set(r.json()["extra_logs"]) == {"lenient", "lenient/left_out"}
    failed = httpx.post(f"{server.url}/get_reward?scorer=guarded", json={"query": ["abcd", "NAN!"]})
    assert failed.status_code == 500 and failed.json()["code"] == "non_finite"  # never a number


def test_item_penalty_rewards_the_items_own_failure_and_says_which_kind(server):
    """`double`: "ERR" is an item-kind failure, "NAN" a service-kind one."""
    body = {"query": ["ok", "ERR"], "prompts": ["", ""], "labels": [None, None]}
    r = httpx.post(f"{server.url}/get_reward?scorer=double", json=body)
    assert r.status_code == 422 and r.json()["code"] == "bad_image" and r.json()["kind"] == "item"
    r = httpx.post(f"{server.url}/get_reward?scorer=double&item_penalty=-1", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == [2.0, -1.0] and r.json()["extra_logs"]["double/penalised"] == [0.0, 1.0]
    r = httpx.post(
        f"{server.url}/get_reward?scorer=double&item_penalty=-1", json={**body, "query": ["ok", "NAN"]}
    )
    assert r.status_code == 500 and r.json()["kind"] == "service"  # never penalised: OpenRLHF retries
