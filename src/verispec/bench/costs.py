"""The cost model, measured: c = draft step / target step, and the target's T(k+1) / T(1).

Each time is the median of several direct forward calls on a fresh cache that holds a real prompt,
so it is the model's cost alone, without the loop around it. Repetitions are interleaved across
the measurements so that machine drift hits all of them alike. The draft step uses the head the draft
drafts with (a restricted head when --draft-vocab keeps one), and runs as drafting runs it (one native call
per greedy step where the draft runs natively end to end).

On the native kernels the costs also say where a step goes: the weight bytes a step reads against the
machine's read bandwidth, and the share of the step spent in the matrix products.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..models.model import Transformer

PASS_WIDTHS = (4, 8)  # passes over this many tokens are timed whatever k the bench runs: T(4) and T(8) in every report


@dataclass(frozen=True)
class Costs:
    context_tokens: int
    repeats: int
    target_step_s: float  # T(1): one target pass over one new token
    draft_step_s: float | None  # one draft pass over one new token
    target_verify_s: dict[int, float]  # k -> T(k+1)
    pass_s: dict[int, float] | None = None  # n -> T(n) for the fixed widths PASS_WIDTHS (any k)
    prefill_s: float | None = None  # the target's prefill of the context (a fresh cache)
    native: dict | None = None  # native kernels only: bytes, bandwidth and the products' share (see _native)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.context_tokens / self.prefill_s if self.prefill_s else None

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
            "pass_ratio": {str(n): t / self.target_step_s for n, t in (self.pass_s or {}).items()},
            "prefill_s": self.prefill_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "native": self.native,
        }


def measure_costs(
    target: Transformer,
    draft: Transformer | None,
    context: list[int],
    ks: tuple[int, ...],
    repeats: int,
    draft_head: nn.Module | None = None,
) -> Costs:
    timers: dict[str, Callable[[], float]] = {"target": _step_timer(target, context, 1)}
    if draft is not None:
        timers["draft"] = _draft_step_timer(draft, context, draft_head)
    for k in ks:
        timers[f"verify{k}"] = _step_timer(target, context, k + 1)
    for n in PASS_WIDTHS:
        timers[f"pass{n}"] = _step_timer(target, context, n)
    timers["prefill"] = _prefill_timer(target, context)
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
        pass_s={n: median[f"pass{n}"] for n in PASS_WIDTHS},
        prefill_s=median["prefill"],
        native=_native(target, draft, draft_head=draft_head, timers=timers, median=median, repeats=repeats),
    )


def _step_timer(model: Transformer, context: list[int], n: int, head: nn.Module | None = None) -> Callable[[], float]:
    """A function that times one forward pass of `n` new tokens after `context` (cache rolled back each time)."""
    cache = model.new_cache(num_slots=1, max_len=len(context) + n)
    model(_ids(context, model), cache, [0], num_logits=1)
    new = _ids((context * (n // len(context) + 1))[:n], model)

    def once() -> float:
        cache.set_length(0, len(context))
        begin = time.perf_counter()
        model(new, cache, [0], num_logits=n, head=head)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - begin

    once()  # warm-up: first calls allocate
    return once


def _draft_step_timer(model: Transformer, context: list[int], head: nn.Module | None) -> Callable[[], float]:
    """One draft step as drafting takes it: a native greedy step (kernels/greedy.py: embedding to argmax in one
    call) where the draft runs natively end to end, else a forward with its head. A draft of k tokens takes its k
    steps in one call, so this one-step call is an upper bound on a step inside it."""
    from ..kernels.greedy import GreedySteps

    head_module = head or model.lm_head
    if not GreedySteps.supports(model, head_module):
        return _step_timer(model, context, 1, head)
    steps = GreedySteps(model, head_module, None, head_module.out_features)
    cache = model.new_cache(num_slots=1, max_len=len(context) + 1)
    model(_ids(context, model), cache, [0], num_logits=1)

    def once() -> float:
        cache.set_length(0, len(context))
        begin = time.perf_counter()
        steps(cache, [0], [context[:1]], 1)
        return time.perf_counter() - begin

    once()
    return once


def _prefill_timer(model: Transformer, context: list[int]) -> Callable[[], float]:
    ids = _ids(context, model)

    def once() -> float:
        cache = model.new_cache(num_slots=1, max_len=len(context))
        begin = time.perf_counter()
        model(ids, cache, [0], num_logits=1, invariant=False)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - begin

    return once


def _native(
    target: Transformer,
    draft: Transformer | None,
    draft_head: nn.Module | None,
    timers: dict[str, Callable[[], float]],
    median: dict[str, float],
    repeats: int,
) -> dict | None:
    """For models on the native stack: weight bytes per step, GB/s against the machine's read bandwidth, and
    the share of a step spent in products (the stack's products plus the output head), in attention, and
    elsewhere."""
    from ..kernels import native
    from ..kernels.linear import NativeLinear
    from ..kernels.stack import NativeStack

    if not isinstance(target.fused_blocks, NativeStack):
        return None
    out: dict = {"read_gb_per_s": native.read_bandwidth()}
    for name, model, head in (("target", target, None), ("draft", draft, draft_head)):
        if model is None or not isinstance(model.fused_blocks, NativeStack):
            continue
        head = head or model.lm_head
        weights = sum(p.nbytes for m in model.layers.modules() if isinstance(m, NativeLinear) for p in m.buffers())
        weights += sum(p.nbytes for p in head.buffers()) if isinstance(head, NativeLinear) else 0
        NativeStack.timing()  # restart the counters
        with _timed(head) as head_times:  # the head inside the step: read cold, after the blocks
            steps = [timers[name]() for _ in range(repeats)]
        stack_s, products_s, native_head_s, attention_s = (t / repeats for t in NativeStack.timing())
        # the shares are means over these same steps (products and head lie inside each step, so they cannot
        # exceed it); a median step beside a mean split would not add up on a machine that drifts. A native
        # greedy step runs its head inside the library, which times it.
        head_s = statistics.mean(head_times) if head_times else native_head_s
        step_s = statistics.mean(steps)
        share = (products_s + head_s) / step_s
        out[name] = {
            "weight_bytes": weights, "gb_per_s": weights / median[name] / 1e9,
            "products_share": share, "other_share": 1 - share,
            "stack_s": stack_s, "stack_products_s": products_s, "head_s": head_s, "attention_s": attention_s,
            "attention_share": attention_s / step_s,
        }  # fmt: skip
    return out


@contextmanager
def _timed(module: nn.Module) -> Iterator[list[float]]:
    """Seconds of each call of `module` while the block runs (forward hooks)."""
    times: list[float] = []
    began: list[float] = []
    hooks = (module.register_forward_pre_hook(lambda *_: began.append(time.perf_counter())),
             module.register_forward_hook(lambda *_: times.append(time.perf_counter() - began.pop())))  # fmt: skip
    try:
        yield times
    finally:
        for hook in hooks:
            hook.remove()


def _ids(tokens: list[int], model: Transformer) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long, device=model.device)
