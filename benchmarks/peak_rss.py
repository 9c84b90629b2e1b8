"""Peak resident memory of this process, sampled in a thread: what the benchmarks report as memory."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil


class PeakRSS:
    """Resident set size sampled every ``interval`` seconds; ``peak - base`` is the peak above the
    start. Use as a context manager, or ``start()`` / ``stop()`` around a longer stretch."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def start(self) -> PeakRSS:
        self._t.start()
        return self

    def stop(self) -> int:
        """Stop sampling; the peak above the start, in bytes."""
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        return self.peak - self.base

    def __enter__(self) -> PeakRSS:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
