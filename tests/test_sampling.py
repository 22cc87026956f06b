import pytest
import torch

from verispec.decoding.sampling import SamplingParams, probs_from_logits
from verispec.errors import InvalidParameterError


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, False, True, False]
    assert probs.sum() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    probs = probs_from_logits(probs_in.log(), SamplingParams(temperature=1.0, top_p=0.8))
    assert (probs > 0).tolist() == [True, True, False, False]
    assert probs[:2].tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8])
    probs = probs_from_logits(probs_in.log(), SamplingParams(temperature=1.0, top_p=0.81))
    assert (probs > 0).tolist() == [True, True, True, False]


@pytest.mark.parametrize("top_p", [1e-50, 5e-324, 1e-9])
def test_a_top_p_below_float32_keeps_the_most_likely_token(top_p):
    """1e-50 and 5e-324 are 0 in float32: they once dropped every token (NaN probabilities); like OpenAI and vLLM,
    a tiny top_p keeps the most likely token. Rows are filtered one by one (the batch's other row is unchanged)."""
    logits = torch.tensor([[0.1, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 0.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert not probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.99)).eq(0).all(-1).any()


def test_temperature_scales_logits_and_greedy_is_one_hot():
    logits = torch.tensor([0.0, 1.0, 2.0])
    assert probs_from_logits(logits, SamplingParams(temperature=0.5)).tolist() == pytest.approx(
        (logits / 0.5).softmax(-1).tolist()
    )
    assert probs_from_logits(logits, SamplingParams()).tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(temperature=float("nan"))]
)
def test_bad_parameters_raise_a_clear_error(kwargs):
    with pytest.raises(InvalidParameterError):
        SamplingParams(**kwargs)
