"""`rewardplane eval --benchmark NAME`: public reward-model benchmarks from local files, with intervals.

One path for the three benchmarks:

1. read the local copy in its published schema (`loader`); a file in another schema is one
   line naming the missing columns; bad rows are rejected with reason codes and counted;
2. score every distinct (prompt, response) once, through the checkpoint's objective scorer
   (`rewardplane.objectives.registry.load_pair_scorer`, as `rewardplane eval --probe`): a reward
   model scores the texts on their own (`PairScorer.score_branch_chunks`: packed forwards on
   CUDA in bf16/fp16, where the responses to one prompt share its tokens; length-sorted padded
   buckets elsewhere); other objectives get them sorted by length, two per `TokenizedPair`.
   The texts are tokenised on a thread, `STREAM_ITEMS` examples at a time, while the GPU
   scores the chunks before (`TokenisedTexts`, `core.background.ahead`);
3. apply the benchmark's released scoring rules (`rewardbench`, `rewardbench2`, `rmbench`);
4. bootstrap every number (`common.statistics_block`) and write `examples.jsonl`,
   `worst.json` and `summary.json` (last, with the examples' SHA-256).

`runner.py` holds that path (`evaluate_benchmark`); `loader.py` the published schemas' reader;
`common.py` the statistics and artifacts all three share; one module per benchmark's rules.
"""
