"""Timing shared by the cost benchmarks beside this file."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def interleaved_medians(timers: dict[str, Callable[[], float]], reps: int) -> dict[str, float]:
    """Each timer once to warm up, then `reps` rounds of all of them in turn (a shared machine's drift falls on every
    timer alike); each timer's median seconds."""
    for timer in timers.values():
        timer()
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(reps):
        for name, timer in timers.items():
            samples[name].append(timer())
    return {name: statistics.median(values) for name, values in samples.items()}
