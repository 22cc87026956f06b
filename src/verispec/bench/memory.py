"""Peak memory of one run: resident set size (Linux resets its high-water mark on request) and CUDA."""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class PeakMemory:
    """reset() before a run, read() after it: {"peak_rss_bytes": ..., "peak_cuda_bytes": ...}.

    Where the RSS high-water mark cannot be reset (not Linux), peak_rss_bytes is the process's peak
    so far, and `per_run` is False.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.per_run = self._reset_rss()

    def reset(self) -> None:
        self._reset_rss()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def read(self) -> dict[str, int]:
        peak = {"peak_rss_bytes": _rss_high_water_mark()}
        if self.cuda:
            peak["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated())
        return peak

    @staticmethod
    def _reset_rss() -> bool:
        try:
            _CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False


def _rss_high_water_mark() -> int:
    try:
        match = re.search(r"VmHWM:\s+(\d+)\s+kB", _STATUS.read_text())
    except OSError:
        match = None
    if match:
        return int(match.group(1)) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
