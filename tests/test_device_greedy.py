"""Greedy draft steps of a model on PyTorch's kernels, chosen on its device (models/greedy_steps.py): the drafter's
proposals are the ones its steps driven from Python make, over rounds of acceptances and rejections, with its whole
head and a restricted one; on a GPU the host then waits for the card once a propose, not once a step."""

import pytest
import torch

from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine.draft_model import BatchedDrafter
from verispec.engine.drafting import DraftJob
from verispec.models.greedy_steps import DeviceGreedySteps
from verispec.models.pass_shape import PassShape, use_pass_shape
from verispec.testing import tiny_config, tiny_model

VOCAB = 300


@pytest.mark.parametrize("restricted", [False, True], ids=["whole-head", "restricted-head"])
@pytest.mark.parametrize("shape", [None, PassShape(groups=2, width=4)], ids=["ordinary", "shaped"])
def test_the_drafter_proposes_what_steps_driven_from_python_propose(shape, restricted):
    """At a pass shape every pass is row-invariant, so drafts of different lengths (the one call feeds every
    sequence as far as the longest) must be the same tokens; on ordinary passes, whose rounding depends on the
    batch, both drafts are as long."""
    model = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=64, num_layers=2), seed=3, scale=2.0)
    use_pass_shape(model, shape)
    ids = torch.tensor([*range(0, 120, 2), 299]) if restricted else None
    fast = BatchedDrafter(model, VOCAB, num_slots=2, max_len=128, head_ids=ids)
    slow = BatchedDrafter(model, VOCAB, num_slots=2, max_len=128, head_ids=ids)
    assert isinstance(fast.greedy_steps, DeviceGreedySteps)
    slow.greedy_steps = None
    greedy = SamplingParams(temperature=0.0)
    histories = [list(range(40, 52)), list(range(90, 97))]
    drafted = set()
    for round_ in range(8):
        ks = [3, 1 + round_ % 4] if shape is not None else [1 + round_ % 4] * 2
        jobs = [DraftJob(slot=slot, tokens=histories[slot], k=ks[slot], params=greedy, noise=KeyedNoise(0, VOCAB))
                for slot in range(2)]  # fmt: skip
        got, want = fast.propose(jobs), slow.propose(jobs)
        for a, b, k in zip(got, want, ks, strict=True):
            assert a.tokens.tolist() == b.tokens.tolist() and len(a.tokens) == k
            drafted.update(a.tokens.tolist())
        for i, proposal in enumerate(got):  # accept a prefix, then a token of the "target's" own
            kept = proposal.tokens.tolist()[: round_ % 5]
            histories[i] = histories[i] + kept + [(7 * round_ + i) % VOCAB]
    assert len(drafted) > 3  # not one token over and over
    if restricted:
        assert drafted <= set(ids.tolist())


def test_bad_calls_are_refused():
    model = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=64, num_layers=1))
    drafter = BatchedDrafter(model, VOCAB, num_slots=1, max_len=64, head_ids=None)
    with pytest.raises(ValueError):
        drafter.greedy_steps(drafter.cache, [0], [[1]], 0)
    with pytest.raises(ValueError):
        drafter.greedy_steps(drafter.cache, [0], [[]], 2)
