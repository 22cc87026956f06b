"""The cost model, measured: c = draft step / target step, and the target's T(k+1) / T(1).

Each time is the median of several direct forward calls on a fresh cache that holds a real prompt,
so it is the model's cost alone, without the loop around it. Repetitions are interleaved across
the measurements so that machine drift hits all of them alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model import Transformer


@dataclass(frozen=True)
class Costs:
    context_tokens: int
    repeats: int
    target_step_s: float  # T(1): one target pass over one new token
    draft_step_s: float | None  # one draft pass over one new token
    target_verify_s: dict[int, float]  # k -> T(k+1)

    @property
    def c(self) -> float | None:
        return self.draft_step_s / self.target_step_s if self.draft_step_s is not None else None

    def verify_ratio(self, k: int) -> float | None:
        """T(k+1) / T(1): what verifying k drafted tokens costs, in target steps (1.0 in the ideal model)."""
        return self.target_verify_s[k] / self.target_step_s if k in self.target_verify_s else None

    def to_dict(self) -> dict:
        return {
            "context_tokens": self.context_tokens,
            "repeats": self.repeats,
            "target_step_s": self.target_step_s,
            "draft_step_s": self.draft_step_s,
            "c": self.c,
            "target_verify_s": {str(k): t for k, t in self.target_verify_s.items()},
            "verify_ratio": {str(k): self.verify_ratio(k) for k in self.target_verify_s},
        }


def measure_costs(
    target: Transformer, draft: Transformer | None, context: list[int], ks: tuple[int, ...], repeats: int
) -> Costs:
    timers: dict[str, Callable[[], float]] = {"target": _step_timer(target, context, 1)}
    if draft is not None:
        timers["draft"] = _step_timer(draft, context, 1)
    for k in ks:
        timers[f"verify{k}"] = _step_timer(target, context, k + 1)
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, timer in timers.items():
            samples[name].append(timer())
    median = {name: statistics.median(values) for name, values in samples.items()}
    return Costs(
        context_tokens=len(context),
        repeats=repeats,
        target_step_s=median["target"],
        draft_step_s=median.get("draft"),
        target_verify_s={k: median[f"verify{k}"] for k in ks},
    )


def _step_timer(model: Transformer, context: list[int], n: int) -> Callable[[], float]:
    """A function that times one forward pass of `n` new tokens after `context` (cache rolled back each time)."""
    cache = model.new_cache(num_slots=1, max_len=len(context) + n)
    model(_ids(context, model), cache, [0], num_logits=1)
    new = _ids((context * (n // len(context) + 1))[:n], model)

    def once() -> float:
        cache.set_length(0, len(context))
        begin = time.perf_counter()
        model(new, cache, [0], num_logits=n)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - begin

    once()  # warm-up: first calls allocate
    return once


def _ids(tokens: list[int], model: Transformer) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long, device=model.device)
