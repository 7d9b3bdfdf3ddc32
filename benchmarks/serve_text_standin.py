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

The server process finds this class through the `rewardkit.scorers` entry-point group, which
serve_text.py points here with a throw-away dist-info directory on PYTHONPATH (the deploy
gateway passes its sys.path on to its workers, so `--deploy` finds it too).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from rewardkit.models.tiny import tiny_config
from rewardkit.serve.scorers.text import SeqClsScorer

KIND = "host_standin"
"""The scorer kind serve_text.py registers for this class."""


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


class StandInScorer(SeqClsScorer):
    """`hf_seqcls` over a named shape's tokenizer and config, forward replaced (module docstring)."""

    kind: ClassVar[str] = KIND

    def _load_model(self):
        from transformers import AutoTokenizer

        if self.shape is None or not self.options.get("tokenizer"):
            raise ValueError(f"{KIND} needs a shape and options.tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(self.options["tokenizer"], local_files_only=True)
        config = tiny_config(
            "tiny-llama" if self.shape == "tiny-text-rm" else self.shape,
            num_labels=1,
            pad_token_id=tokenizer.pad_token_id,
        )
        return _StandInModel(config), tokenizer, f"standin:{self.shape}"

    def _choose_attention(self) -> str:
        return "varlen"  # the GPU path's host work, on any device
