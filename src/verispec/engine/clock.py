"""The engine's clock for work on a device: what the draft policy, prefill pacing and the statistics price.

On CUDA a call queues its kernels and returns; a clock read right after it measures the launch, and the work is
billed to whatever next waits for the device (a verify pass's time to the sampler, a draft step's to the verify
pass). `settled` waits for the device's queue before reading the clock, so that an interval holds the work done in
it. The engine reads its results on the host right after anyway, so the wait costs nothing it would not pay. On a
CPU it is the plain clock."""

from __future__ import annotations

import time

import torch


def settled(device: torch.device | str) -> float:
    """time.perf_counter() once the work queued on `device` is done."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
