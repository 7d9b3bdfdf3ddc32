"""Text scorers: tokenised on admission, empty responses, padded buckets equal a plain forward."""

from __future__ import annotations

import pytest
import torch

from rewardplane.core.errors import ConfigError
from rewardplane.serve.admission import admitted
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.text import SeqClsScorer


def scorer(**options) -> SeqClsScorer:
    s = SeqClsScorer("rm", shape="tiny-text-rm", options=options)
    s.load()
    return s


def items(*responses: str) -> list[ScoreItem]:
    return [ScoreItem(id=str(k), prompt="Say hello.", response=r) for k, r in enumerate(responses)]


def admitted_scores(s: SeqClsScorer, batch: list[ScoreItem]) -> list:
    """What the service answers: the admission contract (serve/admission.py), then the scorer."""
    return admitted(s, batch, s.score_batch)


def test_empty_or_blank_responses_are_bad_input_by_default_or_get_the_configured_reward():
    batch = items("Hello there!", "", "   \n")
    default = admitted_scores(scorer(), batch)
    assert isinstance(default[0], float)
    assert [r.code for r in default[1:]] == ["bad_input", "bad_input"]
    fixed = admitted_scores(scorer(empty_response=-1.5), batch)
    assert fixed[1:] == [-1.5, -1.5] and fixed[0] == default[0]
    scored = admitted_scores(scorer(empty_response="score"), batch)
    assert all(isinstance(r, float) for r in scored)
    with pytest.raises(ConfigError, match="empty_response"):
        SeqClsScorer("rm", shape="tiny-text-rm", options={"empty_response": "zero"})


def test_padded_buckets_score_like_one_plain_forward_per_item_and_report_padding():
    s = scorer(max_batch_tokens=64)
    batch = items("Hi.", "Hello! " * 12, "Good day to you, friend.", "Yes.")
    got = s.score_prepared([s.prepare(i) for i in batch])
    with torch.no_grad():
        plain = [float(s.model(input_ids=torch.tensor([s.prepare(i)])).logits[0, 0]) for i in batch]
    assert got == pytest.approx(plain, abs=1e-5)
    stats = s.take_batch_stats()
    assert stats["real"] == sum(len(s.prepare(i)) for i in batch)
    assert stats["computed"] == stats["real"] + stats["padding"] and stats["shared"] == 0
    assert s.info().extra["attention"] == "padded"  # no varlen kernel on CPU


def test_prepare_is_what_admission_runs_and_an_unencodable_item_fails_there():
    s = scorer()
    ids = s.prepare(items("Hello!")[0])
    assert isinstance(ids, list) and all(isinstance(t, int) for t in ids)
    bad = ScoreItem(id="x", prompt=[], response="Hello!")
    out = s.prepare(bad)
    assert isinstance(out, ItemError) and out.code == "bad_input"


def test_varlen_attention_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="varlen needs CUDA"):
        scorer(attention="varlen")


def test_batches_pipeline_only_on_the_packed_path_and_the_depth_never_changes_a_score():
    s = scorer(pipeline_depth=3)
    assert s.concurrent_batches == 1  # padded CPU forwards would only share the cores
    s.attention = "varlen"  # what load chooses on CUDA in bf16
    assert s.concurrent_batches == 3
    assert scorer().info().identity == scorer(pipeline_depth=1).info().identity
    for bad in (0, 5, True, "2"):
        with pytest.raises(ConfigError, match="pipeline_depth"):
            SeqClsScorer("rm", shape="tiny-text-rm", options={"pipeline_depth": bad})


GROUP_PROMPTS = [
    "Say hello.",
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi!"}],
]
GROUP_RESPONSES = ["Hello there!", "\n\nHello.", " Hi", "Good day to you, friend.", "Yes.", "Hello! " * 9]


@pytest.mark.parametrize("tokenizer", ["builtin", "llama3"])
def test_a_group_sharing_a_prompt_gets_the_unshared_ids_and_renders_the_prompt_once(tokenizer, tmp_path):
    """prepare_many renders and tokenises each distinct prompt once (the prompt cache), and every
    item's ids are exactly tokenize_branch's, the template's own tokens at the boundary."""
    from rewardplane.data.tokenize import tokenize_branch
    from rewardplane.serve.scorers.common import as_messages
    from support.tokenizers import llama3_like

    options = {}
    if tokenizer == "llama3":
        llama3_like().save_pretrained(tmp_path / "tok")
        options["tokenizer"] = str(tmp_path / "tok")
    s = scorer(**options)
    group = [ScoreItem(id=f"{p}-{r}", prompt=prompt, response=response)
             for p, prompt in enumerate(GROUP_PROMPTS) for r, response in enumerate(GROUP_RESPONSES)]  # fmt: skip
    got = s.prepare_many(group)
    for item, ids in zip(group, got, strict=True):
        unshared = tokenize_branch(
            s.tokenizer, as_messages(item.prompt, "user"), as_messages(item.response, "assistant")
        ).input_ids
        assert ids == unshared
        assert ids == list(
            s.tokenizer.apply_chat_template(
                [*as_messages(item.prompt, "user"), *as_messages(item.response, "assistant")],
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
    assert (s.prompts.misses, s.prompts.hits, len(s.prompts)) == (2, 2 * len(GROUP_RESPONSES) - 2, 2)
    assert s.prepare_many(group) == got and s.prompts.misses == 2  # a later request: all hits
    uncached = scorer(prompt_cache=0, **options)
    assert uncached.prepare_many(group) == got and len(uncached.prompts) == 0
    assert uncached.info().identity == s.info().identity  # the cache never changes a score


def test_a_group_scores_like_its_items_one_by_one_and_bad_items_fail_alone():
    s = scorer(max_length=40)
    batch = [*items("Hello there!", "", "Hello! " * 30), ScoreItem(id="x", prompt=[], response="Hi")]
    prepared = admitted(s, batch, s.prepare_many)
    assert prepared == admitted(s, batch, lambda todo: [s.prepare(i) for i in todo])
    assert isinstance(prepared[0], list)
    assert [p.code for p in prepared[1:]] == ["bad_input", "too_long", "bad_input"]
    with pytest.raises(TypeError):  # a lone surrogate spoils a shared tokenizer call...
        s.prepare_many(items("Hello!", "bad \ud800"))
    alone = s.prepare(items("bad \ud800")[0])  # ...and alone it is that item's bad_input
    assert isinstance(alone, ItemError) and alone.code == "bad_input"


def test_the_prompt_cache_is_bounded_by_entries_and_characters_least_recently_used_out():
    from rewardplane.serve.scorers.text import PromptCache

    s = scorer()

    def rendered(text: str):
        from rewardplane.data.tokenize import render_prompt

        return render_prompt(s.tokenizer, [{"role": "user", "content": text}])

    cache = PromptCache(2, max_chars=10_000)
    a, b, c = (PromptCache.key(t) for t in ("a", "b", "c"))
    cache.put(a, rendered("a"))
    cache.put(b, rendered("b"))
    assert cache.get(a) is not None  # a is now the most recently used
    cache.put(c, rendered("c"))
    assert len(cache) == 2 and cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None
    assert PromptCache.key("x") != PromptCache.key([{"role": "user", "content": "x"}])
    small = PromptCache(100, max_chars=200)
    small.put(PromptCache.key("y" * 500), rendered("y" * 500))  # larger than the whole cache
    assert len(small) == 0
    for k in range(10):
        small.put(PromptCache.key(f"p{k}"), rendered(f"p{k}"))
    size = sum(len(key[1]) + len(v.text) for key, v in small._entries.items())
    assert 0 < size <= 200 and small.get(PromptCache.key("p9")) is not None
    assert small.get(PromptCache.key("p0")) is None


def test_a_model_that_pads_with_eos_is_read_where_transformers_pools_on_both_paths(tmp_path):
    """`*ForSequenceClassification` reads the rightmost token that is not the pad id: with
    pad == eos, a text_eos sequence is read before its final EOS. The scorer gives that number
    on the padded path and on the packed one (forced here on CPU, where rk_varlen attends
    sequence by sequence)."""
    from transformers import AutoModelForSequenceClassification

    from rewardplane.data.synth import builtin_tokenizer
    from rewardplane.models.tiny import tiny_config
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer

    tok = builtin_tokenizer()
    config = tiny_config("tiny-llama", num_labels=1, pad_token_id=tok.eos_token_id)
    config.vocab_size = len(tok)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    spec = ScorerSpec(name="s", kind="hf_seqcls", path=str(tmp_path / "rm"), device="cpu",
                      options={"plain_text": "text_eos"})  # fmt: skip
    s = build_scorer(spec)
    s.load()
    batch = [
        ScoreItem(str(k), "Say hello.", r) for k, r in enumerate(["Hello there!", "Hi", "Good day to you."])
    ]
    prepared = [s.prepare(i) for i in batch]
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    with torch.no_grad():
        hf = [
            float(
                model(
                    input_ids=torch.tensor([tok(i.prompt + i.response + tok.eos_token)["input_ids"]])
                ).logits[0, 0]
            )
            for i in batch
        ]
    assert s.score_prepared(prepared) == pytest.approx(hf, abs=1e-5)
    import rewardplane.models.attention  # noqa: F401  (registers rk_varlen)

    s.attention, s.packs_tokens = "varlen", True
    s.backbone.set_attn_implementation("rk_varlen")
    assert s.score_prepared(prepared) == pytest.approx(hf, abs=1e-5)


def test_prompt_cache_keys_tell_strings_plain_messages_and_other_lists_apart():
    from rewardplane.serve.scorers.text import PromptCache

    keys = [
        PromptCache.key("hi"),
        PromptCache.key([{"role": "user", "content": "hi"}]),
        PromptCache.key([{"role": "user", "content": "hi", "name": "x"}]),
        PromptCache.key([{"role": "user", "content": ["hi"]}]),
    ]
    assert len(set(keys)) == 4
    assert PromptCache.key([{"content": "hi", "role": "user"}]) == keys[1]  # key order is no matter
    cache = PromptCache(4, max_chars=20)
    cache.put(keys[1], type("R", (), {"text": "x" * 5})())
    assert cache.get(keys[1]) is not None and cache.get(keys[0]) is None
