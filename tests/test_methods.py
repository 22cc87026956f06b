"""The ways of drafting as one registry (engine/methods.py): one verdict on the same flags in `generate`, `serve`, the
Python API and `bench`; a registered method is a choice everywhere; a proposal wider than its method reserved fails
its own request, never the batch."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
import torch

from verispec import cli
from verispec.bench.config import BenchConfig, bench_method_names
from verispec.decoding.sampling import SamplingParams
from verispec.engine.drafting import DraftCost, Proposal
from verispec.engine.methods import DraftModelUse, Method, method_names, register, resolve_method, unregister
from verispec.engine.requests import EngineRequest, ErrorEvent, FinishEvent
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.errors import InvalidParameterError, VerispecError
from verispec.generator import SpeculativeGenerator
from verispec.server import engine_from_args
from verispec.testing import tiny_pair


class Loading(Exception):
    """Raised where a front end starts loading models: the flags were accepted."""


ACCEPTED = "accepted"


def _verdict(run) -> str:
    try:
        run()
    except Loading:
        return ACCEPTED
    except VerispecError as exc:
        return str(exc)
    raise AssertionError("the front end neither loaded models nor refused")


def _generate(method: str, draft: str, monkeypatch) -> str:
    monkeypatch.setattr("verispec.models.loading.load_pair", _loading)
    stderr = io.StringIO()
    argv = ["generate", "hello", "--speculative-method", method, "--speculative-model", draft]
    with contextlib.redirect_stderr(stderr):
        try:
            status = cli.main(argv)
        except Loading:
            return ACCEPTED
        except SystemExit as exit:  # argparse refused a choice
            status = exit.code
    assert status == 2
    return stderr.getvalue().strip().removeprefix("verispec: error: ")


def _serve(method: str, draft: str, monkeypatch) -> str:
    monkeypatch.setattr(engine_from_args, "load_models", _loading)
    cli._load_extensions()
    parser = argparse.ArgumentParser()
    cli.COMMANDS["serve"][0](parser)
    try:
        args = parser.parse_args(["--speculative-method", method, "--speculative-model", draft])
    except SystemExit:  # argparse refused a choice
        return "invalid choice"
    return _verdict(lambda: engine_from_args.build_scheduler(args))


def _api(method: str, draft: str, monkeypatch) -> str:
    monkeypatch.setattr("verispec.models.loading.load_pair", _loading)
    source = None if draft == "none" else draft
    return _verdict(lambda: SpeculativeGenerator("target", source, speculative_method=method))


def _bench(method: str, draft: str, monkeypatch) -> str:
    config = BenchConfig(methods=(method,), draft_model=None if draft == "none" else draft)
    try:
        config.checked()
    except VerispecError as exc:
        return str(exc)
    return ACCEPTED


def _loading(*args, **kwargs):
    raise Loading


FRONT_ENDS = {"serve": _serve, "api": _api, "bench": _bench}


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("draft", ["draft", "none"])
@pytest.mark.parametrize("method", [*method_names(), "no-such-method"])
def test_the_same_method_flags_get_the_same_verdict_in_generate_and_every_other_front_end(
    method, draft, front_end, monkeypatch
):
    """`generate` against serve, the Python API and bench: accepted by all, or refused by all with one message (an
    unknown name: each front end's own wording, but refused everywhere)."""
    expected = _generate(method, draft, monkeypatch)
    got = FRONT_ENDS[front_end](method, draft, monkeypatch)
    if method == "no-such-method":
        assert expected != ACCEPTED and got != ACCEPTED
    else:
        assert got == expected
    if method in ("draft", "hybrid") and draft == "none":
        assert "needs a draft model" in got  # the case that decoded plainly in `generate` without a word


def test_the_verdicts_follow_the_methods_properties():
    assert resolve_method(None, draft_model=True).name == "suffix"  # the one default
    assert resolve_method(None, draft_model=False) is None  # plain decoding
    assert resolve_method("suffix", draft_model=False).name == "suffix"  # the lookups alone
    assert resolve_method("ngram", draft_model=True).uses_draft_model is False  # a draft model given is not loaded
    with pytest.raises(InvalidParameterError, match="needs a draft model"):
        resolve_method("draft", draft_model=False)


class Runaway:
    """A lookup proposer that repeats the last token 16 times whatever it is asked (more than its method reserved room
    for), or, `obedient`, as often as the job allows (DraftJob.widest)."""

    looks_up, drafter, spent = True, None, DraftCost()

    def __init__(self, obedient: bool = False):
        self.obedient = obedient

    def propose(self, jobs):
        widths = [min(16, job.widest) if self.obedient else 16 for job in jobs]
        drafts = [job.tokens[-1:] * n for job, n in zip(jobs, widths, strict=True)]
        return [Proposal(torch.tensor(draft), looked_up=True) for draft in drafts]

    def admit(self, slot, partition): ...

    def lag(self, slot, tokens, model_tokens=None):
        return 0

    def finished(self, slot, output, partition): ...

    def forget(self, history=True, prompts=True): ...


@pytest.fixture
def registered():
    added = []

    def add(method: Method) -> Method:
        added.append(method.name)
        return register(method)

    yield add
    for name in added:
        unregister(name)


def test_a_registered_method_is_a_choice_of_every_front_end(registered):
    registered(Method(name="runaway", summary="drafts too far", build=lambda setup: Runaway(),
                      draft_model=DraftModelUse.UNUSED))  # fmt: skip
    parser = argparse.ArgumentParser()
    cli._generate_arguments(parser)
    assert parser.parse_args(["x", "--speculative-method", "runaway"]).speculative_method == "runaway"
    assert "runaway" in bench_method_names() and "auto-runaway" in bench_method_names()


def test_a_proposal_wider_than_its_method_reserved_fails_its_own_request_and_no_other(registered):
    """A lookup method registered with the default widest (k) that proposes 16 tokens at k = 3: its requests fail
    with an error naming the overrun; a plain request decoding beside it in the same batch finishes with plain
    decoding's output."""
    registered(Method(name="runaway", summary="drafts too far", build=lambda setup: Runaway(),
                      draft_model=DraftModelUse.UNUSED))  # fmt: skip
    target, _ = tiny_pair()
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    config = SchedulerConfig(max_num_seqs=2, max_model_len=256, num_speculative_tokens=3, draft_policy="always",
                             speculative_method="runaway")  # fmt: skip
    scheduler = Scheduler(target, None, config)
    prompt = target.tokenizer.encode("The quick brown fox")
    runaway, bystander = [], []
    scheduler.submit(
        EngineRequest(
            request_id="runaway", prompt_ids=prompt, params=SamplingParams(), max_tokens=20, sink=runaway.append
        )
    )
    scheduler.submit(
        EngineRequest(
            request_id="bystander",
            prompt_ids=prompt,
            params=SamplingParams(),
            max_tokens=20,
            sink=bystander.append,
            speculative=False,
        )
    )
    scheduler.run_until_idle()
    assert isinstance(runaway[-1], ErrorEvent)
    assert isinstance(bystander[-1], FinishEvent)
    assert bystander[-1].output.token_ids == plain.generate(prompt, max_tokens=20).token_ids


def test_a_method_that_declares_its_width_runs_its_wide_proposals(registered):
    """The same proposer with `widest` 16, drafting what its jobs allow: 16 tokens until the end nears, and greedy
    output is plain decoding's."""
    registered(Method(name="runaway", summary="drafts 16", build=lambda setup: Runaway(obedient=True),
                      draft_model=DraftModelUse.UNUSED, widest=lambda k: 16))  # fmt: skip
    target, _ = tiny_pair()
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    wide = SpeculativeGenerator(target, None, max_seq_len=256, progress=False, speculative_method="runaway",
                                num_speculative_tokens=3, adaptive=False)  # fmt: skip
    prompt = "The quick brown fox"
    assert wide.generate(prompt, max_tokens=20).token_ids == plain.generate(prompt, max_tokens=20).token_ids
