"""Whole-request errors of the reward service, re-exported from `rewardplane.serve.protocol`.

The codes, their HTTP statuses, the per-item codes and `ServeError` are part of the wire
format, so they are defined there with the rest of it; this module keeps the import path that
batchers, backends and scorers already use.
"""

from __future__ import annotations

from rewardplane.serve.protocol import ITEM_ERROR_CODES, STATUS_BY_CODE, ServeError

__all__ = ["ITEM_ERROR_CODES", "STATUS_BY_CODE", "ServeError"]
