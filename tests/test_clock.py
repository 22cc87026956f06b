"""The engine's clock (engine/clock.py): on CUDA it waits for the device's queued work before reading the time, so an
interval holds the work done in it; on a CPU it reads the time alone."""

import time

import torch

from verispec.engine.clock import settled


def test_the_clock_waits_for_cuda_work_before_reading_the_time(monkeypatch):
    waited = []

    def work_finishing(device):  # the queued kernels, done 50 ms from now
        waited.append(device)
        time.sleep(0.05)

    monkeypatch.setattr(torch.cuda, "synchronize", work_finishing)
    begin = time.perf_counter()
    assert settled("cuda:0") - begin >= 0.05
    assert waited == [torch.device("cuda:0")]
    settled(torch.device("cpu"))
    assert waited == [torch.device("cuda:0")]  # a CPU's work is done when the call returns: no wait
