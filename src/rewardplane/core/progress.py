"""Progress for long loops: a live bar on a terminal, one line every N seconds otherwise.

tqdm on a pipe or a log file writes a new line per refresh (hundreds of lines per run);
`Progress` uses tqdm only when the stream is a terminal and otherwise prints one plain line
every `every_s` seconds and one at the end.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

DEFAULT_EVERY_S = 30.0
"""Without a terminal, one line this often: a few lines per hour-long job, not one per refresh."""


class Progress:
    def __init__(
        self,
        total: int | None,
        desc: str,
        *,
        unit: str = "it",
        initial: int = 0,
        every_s: float = DEFAULT_EVERY_S,
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.n = self._start = initial
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.postfix: dict[str, Any] = {}
        self._bar = None
        self._t0 = self._last = time.monotonic()
        if enabled and _is_tty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.stream)

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        self.postfix.update(postfix)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(**self.postfix)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._line()

    def retotal(self, total: int) -> None:
        """Correct the total once it is known (work found to be smaller than first counted)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def _line(self, final: bool = False) -> None:
        elapsed = time.monotonic() - self._t0
        rate = (self.n - self._start) / elapsed if elapsed > 0 else 0.0
        done = f"{self.n}/{self.total}" if self.total else str(self.n)
        parts = [f"{self.desc}: {done} {self.unit}"]
        if self.total:
            parts.append(f"({100.0 * self.n / self.total:.0f}%)")
        parts.append(f"{rate:.2f} {self.unit}/s")
        if not final and self.total and rate > 0:
            parts.append(f"eta {(self.total - self.n) / rate:.0f} s")
        if final:
            parts.append(f"done in {elapsed:.1f} s")
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        print(" ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self._line(final=True)
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
