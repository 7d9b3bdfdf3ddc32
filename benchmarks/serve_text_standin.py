"""The `hf_seqcls` scorer with its model forward replaced by a near-zero-cost stand-in.

`benchmarks/serve_text.py --variants h` serves this scorer to measure what the *host* can
deliver: everything a real request goes through stays real (HTTP, JSON, admission, the chat
template, tokenisation, batching, packing with `plan_packed`, the host-to-device copies, the
per-item checks, metrics, the response), only the transformer layers are gone. Its seq/s is
the host-side capacity: the most any GPU could get out of this server on this host, to put
beside the in-process varlen ceiling (variant c).

It always takes the padding-free (`varlen`) path the real scorer takes on CUDA in bf16, also on
CPU, so a CPU box measures the GPU path's host work. The "model" maps each token id to a
one-wide hidden state and a 1→1 linear head reads it at each sequence's last token (the real
`packed_scores` index_select), so a score still depends on the ids it was given.

The server process finds this class through the `rewardplane.scorers` entry-point group, which
serve_text.py points here with a throw-away dist-info directory on PYTHONPATH (the deploy
gateway passes its sys.path on to its workers, so `--deploy` finds it too).
"""

from __future__ import annotations

import json
import os
import threading
import time
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from rewardplane.models.tiny import tiny_config
from rewardplane.serve.scorers.text import SeqClsOptions, SeqClsScorer

KIND = "host_standin"
"""The scorer kind serve_text.py registers for this class."""

_DEVICE = threading.Lock()
"""With `simulate_us_per_token`: one simulated GPU, whose batches run one after another."""


class _Backbone(torch.nn.Module):
    """Takes `packed_scores`' forward kwargs and returns one float per token: no layers."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # packed_scores reads the device from it

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(last_hidden_state=input_ids[..., None].to(self.anchor.dtype))

    def set_attn_implementation(self, name: str) -> None:
        """Nothing to switch: there is no attention."""


class _StandInModel(torch.nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.base_model = _Backbone(config)
        self.score = torch.nn.Linear(1, 1)
        torch.nn.init.constant_(self.score.weight, 1e-3)
        torch.nn.init.zeros_(self.score.bias)


class StandInOptions(SeqClsOptions):
    simulate_us_per_token: float | None = None
    """Simulate a device: each batch sleeps this many microseconds per token, one batch at a time."""
    simulate_batch_ms: float | None = None
    """With a simulated device: the host time of planning, copying and launching a batch."""


class StandInScorer(SeqClsScorer):
    """`hf_seqcls` over a named shape's tokenizer and config, forward replaced (module docstring)."""

    kind: ClassVar[str] = KIND
    Options = StandInOptions

    @property
    def concurrent_batches(self) -> int:  # type: ignore[override]
        """Pipelined as the real scorer on CUDA, once a device is simulated."""
        return self.pipeline_depth if self.options.simulate_us_per_token else 1

    @property
    def queues_on_device(self) -> bool:  # type: ignore[override]
        """As the real scorer; `RK_SIM_LAUNCH_AT_ONCE=1` in the server's environment turns the
        fill-while-busy policy off (a second batch leaves with whatever is queued, as before it)."""
        return os.environ.get("RK_SIM_LAUNCH_AT_ONCE") != "1"

    def score_prepared(self, batch: list[Any]) -> list[Any]:
        """The host work, then (with `simulate_us_per_token`) the batch's device time on a
        simulated GPU: a sleep of that many microseconds per token, one batch at a time, the GIL
        released; a batch planned while another runs waits for it, as on one CUDA stream.
        `RK_BATCH_LOG` names a file that gets one JSON line per batch (tokens, items, waits)."""
        t0 = time.perf_counter()
        out = super().score_prepared(batch)
        us = self.options.simulate_us_per_token or 0.0
        tokens = sum(len(p) for p in batch if isinstance(p, list))
        if us and self.options.simulate_batch_ms:
            time.sleep(self.options.simulate_batch_ms / 1e3)  # plan, copies, launches
        t1 = time.perf_counter()
        if us:
            with _DEVICE:
                t2 = time.perf_counter()
                time.sleep(tokens * us / 1e6)
        else:
            t2 = t1
        log = os.environ.get("RK_BATCH_LOG")
        if log:
            line = {
                "t": t0,
                "items": len(batch),
                "tokens": tokens,
                "host_s": t1 - t0,
                "device_wait_s": t2 - t1,
            }
            with open(log, "a") as f:
                f.write(json.dumps(line) + "\n")
        return out

    def _load_model(self):
        from transformers import AutoTokenizer

        if self.shape is None or not self.options.tokenizer:
            raise ValueError(f"{KIND} needs a shape and options.tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(self.options.tokenizer, local_files_only=True)
        config = tiny_config(
            "tiny-llama" if self.shape == "tiny-text-rm" else self.shape,
            num_labels=1,
            pad_token_id=tokenizer.pad_token_id,
        )
        return _StandInModel(config), tokenizer, f"standin:{self.shape}"

    def _choose_attention(self) -> str:
        return "varlen"  # the GPU path's host work, on any device
