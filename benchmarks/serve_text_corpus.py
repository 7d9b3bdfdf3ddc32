"""benchmarks/serve_text.py's corpus: GRPO groups of English-like words through a byte-level BPE, the
same for every variant (and for benchmarks/eval_throughput.py and smollm2_weights.py)."""

from __future__ import annotations

import math
import random

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "what",
    "out",
    "up",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
    "should",
    "because",
    "each",
    "just",
    "those",
    "people",
    "how",
    "too",
    "little",
    "state",
    "good",
    "very",
    "make",
    "world",
    "still",
    "own",
    "see",
    "men",
    "work",
    "long",
    "get",
    "here",
    "between",
    "both",
    "life",
    "being",
    "under",
    "never",
    "day",
    "same",
    "another",
    "know",
    "while",
    "last",
    "might",
    "us",
    "great",
    "old",
    "year",
    "off",
    "come",
    "since",
    "against",
    "go",
    "came",
    "right",
    "used",
    "take",
    "three",
    "reward",
    "model",
    "policy",
    "answer",
    "question",
    "explain",
    "because",
    "therefore",
    "number",
    "result",
    "step",
    "proof",
    "value",
    "function",
    "code",
    "test",
    "data",
]


def build_tokenizer():
    """The built-in byte-level BPE (rewardplane.data.builtin_tokenizer) trained on the word list."""
    from rewardplane.data.builtin_tokenizer import build_tokenizer as train

    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(2000)]
    return train(lines, vocab_size=2048)


def words_for(tokenizer, n_tokens: int, rng: random.Random) -> str:
    """English-like text of about `n_tokens` tokens."""
    text = " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n_tokens]
    return tokenizer.decode(ids).strip() or "ok"


def build_corpus(tokenizer, n_groups: int, group_size: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups):
        prompt = words_for(tokenizer, int(min(4000, rng.lognormvariate(math.log(150), 0.7))), rng)
        for r in range(group_size):
            target = int(min(4000, rng.lognormvariate(math.log(330), 0.9)))
            response = words_for(tokenizer, target, rng)
            ids = render(tokenizer, prompt, response)
            while len(ids) > 2048:  # clip the whole rendering to the corpus's bound
                response = response[: int(len(response) * 0.8)]
                ids = render(tokenizer, prompt, response)
            while len(ids) < 64:
                response += " " + words_for(tokenizer, 32, rng)
                ids = render(tokenizer, prompt, response)
            rows.append({"group": g, "id": f"g{g}-r{r}", "prompt": prompt, "response": response, "ids": ids})
    return rows


def render(tokenizer, prompt: str, response: str) -> list[int]:
    from rewardplane.data.tokenize import tokenize_branch

    messages = [{"role": "user", "content": prompt}], [{"role": "assistant", "content": response}]
    return list(tokenize_branch(tokenizer, *messages).input_ids)
