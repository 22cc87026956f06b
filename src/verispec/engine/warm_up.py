"""A server's warm-up: one request through every path a first request takes, before the server says it is ready.

The first pass of each path (the target's prefill and decode products, the draft model's catch-up and drafting,
the verify pass over k + 1 rows) faults the weights' pages in and allocates its buffers: on the bundled pair that
cost 0.3 s in the target and 0.25 s more in the draft model (its first catch-up read 5.7 ms a token, later ones
1.6 ms), paid by whoever came first. Rules:

- The warm-up drafts at every step (policy "always"), so the draft model runs, whatever the server's policy.
- It leaves nothing a request could find: the prefixes it registered and the lookups' index are forgotten, and
  the policy and the metrics start empty, as a server that served nothing (its timings, taken while pages were
  still faulting, would misprice the first requests' steps).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..decoding.sampling import SamplingParams
from .metrics import Metrics
from .policy import DraftPolicy, PolicySettings
from .requests import EngineRequest, ErrorEvent

if TYPE_CHECKING:
    from .scheduler import Scheduler

# prose and code, so that the draft model drafts (a lookup finds little in it) and the prompt spans prefill rows
WARM_UP_TEXT = (
    "Speculative decoding lets a small model propose the next few tokens and a large one check them in one pass. "
    "def mean(values):\n    total = sum(values)\n    return total / len(values)\n"
    "Write a short note on what this function does when the list is empty, and how to fix it."
)
log = logging.getLogger("verispec.server")
WARM_UP_TOKENS = 8  # generated tokens: a few drafting steps, the verify pass at its widest


def warm_up(scheduler: Scheduler) -> float | None:
    """Run one greedy request through `scheduler` in this thread (before its loop starts), then forget it; returns
    the seconds it took, or None where the request failed (logged: the server still starts, and a request that
    meets the same fault gets its error as any would)."""
    begin = time.perf_counter()
    settings = scheduler.policy.settings
    if settings.mode != "never":
        scheduler.policy = DraftPolicy(PolicySettings(k_max=settings.k_max, mode="always"))
    new = min(WARM_UP_TOKENS, scheduler.max_model_len - 1)
    ids = [i for i in scheduler.tokenizer.encode(WARM_UP_TEXT) if i < scheduler.vocab_size] or [0]
    failures: list[ErrorEvent] = []
    request = EngineRequest(
        request_id="warm-up", prompt_ids=ids[: scheduler.max_model_len - new], params=SamplingParams(), max_tokens=new,
        sink=lambda event: failures.append(event) if isinstance(event, ErrorEvent) else None, ignore_eos=True,
    )  # fmt: skip
    scheduler.submit(request)
    scheduler.run_until_idle()
    scheduler.forget_prompts()
    scheduler.forget_history()
    scheduler.policy = DraftPolicy(settings)
    scheduler.metrics = Metrics()
    if failures:
        log.warning("the warm-up request failed: %s", failures[0].message)
        return None
    return time.perf_counter() - begin
