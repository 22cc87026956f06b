"""The server's warm-up (engine/warm_up.py): it runs the draft model and the target, then leaves nothing behind."""

from __future__ import annotations

import argparse

from verispec import cli
from verispec.decoding.sampling import SamplingParams
from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.engine.warm_up import WARM_UP_TEXT, warm_up
from verispec.server import engine_from_args

CONFIG = SchedulerConfig(max_num_seqs=2, max_model_len=512, prefill_chunk=64)


def _run(scheduler: Scheduler, ids: list[int]) -> list[int]:
    outputs = []
    sink = lambda event: outputs.append(event.output) if isinstance(event, FinishEvent) else None  # noqa: E731
    scheduler.submit(EngineRequest(request_id=str(len(ids)), prompt_ids=ids, params=SamplingParams(),
                                   max_tokens=20, sink=sink))  # fmt: skip
    scheduler.run_until_idle()
    return outputs[0].token_ids


def test_the_warm_up_drafts_with_the_model_and_leaves_no_trace(tiny):
    """It drafts with the draft model whatever the policy; afterwards the metrics, the policy and the prefixes are
    a fresh server's (its prompt is prefilled again: the control shows a kept prompt would have been reused),
    and a request decodes exactly as on a server that never warmed up."""
    target, draft = tiny
    scheduler = Scheduler(target, draft, CONFIG)
    metrics, settings = scheduler.metrics, scheduler.policy.settings
    assert warm_up(scheduler) > 0
    assert metrics.drafted_by.labels(proposer="model")._value.get() > 0
    assert metrics.requests.labels(finish_reason="length")._value.get() == 1
    assert scheduler.metrics is not metrics
    assert scheduler.metrics.generation_tokens._value.get() == 0
    assert scheduler.policy.settings == settings and not scheduler.policy.verify and not scheduler.policy.answers
    prompt = target.tokenizer.encode(WARM_UP_TEXT)
    after = _run(scheduler, prompt)
    assert scheduler.metrics.prefill_reused_tokens._value.get() == 0
    _run(scheduler, prompt)  # the control: a prompt the server kept is reused
    assert scheduler.metrics.prefill_reused_tokens._value.get() > 0
    assert after == _run(Scheduler(target, draft, CONFIG), prompt)


def test_the_warm_up_fits_a_short_context_and_plain_decoding(tiny):
    """A context shorter than its text, and a server without a draft model, warm up too."""
    target, draft = tiny
    for model, config in ((draft, SchedulerConfig(max_model_len=6)), (None, SchedulerConfig(max_model_len=64))):
        scheduler = Scheduler(target, model, config)
        warm_up(scheduler)
        assert not scheduler.running and not scheduler.active


def test_a_failed_warm_up_is_logged_and_leaves_a_fresh_server(tiny, monkeypatch, caplog):
    """A fault in the warm-up's request is a warning (the server still starts, reset as after any warm-up), not a
    "warmed up" line; the control: the same server warms up once the fault is gone."""
    target, draft = tiny
    scheduler = Scheduler(target, draft, CONFIG)

    def fault(*args):
        raise RuntimeError("a fault in decoding")

    monkeypatch.setattr(scheduler.emitter, "advance", fault)
    assert warm_up(scheduler) is None
    assert "the warm-up request failed" in caplog.text
    assert not scheduler.running and not scheduler.active and not scheduler.policy.answers
    monkeypatch.undo()
    assert warm_up(scheduler) is not None


def test_serve_warms_up_unless_told_not_to(tiny, monkeypatch):
    """`verispec serve` warms up by default; --no-warm-up skips it."""
    monkeypatch.setattr(engine_from_args, "load_models", lambda args, draft: tiny)
    warmed = []
    monkeypatch.setattr("verispec.engine.warm_up.warm_up", lambda scheduler: warmed.append(scheduler) or 0.0)
    cli._load_extensions()
    parser = argparse.ArgumentParser()
    cli.COMMANDS["serve"][0](parser)
    for flags, expected in (([], 1), (["--no-warm-up"], 0)):
        warmed.clear()
        engine_from_args.build_scheduler(parser.parse_args(["--max-model-len", "64", *flags]))
        assert len(warmed) == expected
