"""The stack's per-row steps (csrc/vsk_rows.c): activation quantization, RMSNorm's sum of squares, SwiGLU and argmax.
Every vector path computes the portable definition's bits exactly (so a row's result does not depend on the
path), and the definitions match float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kernels import paths

from verispec.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not compiled")

Q8_0, Q4_K = 8, 12  # activations in 32-blocks (Q8_0's) and in 256-blocks (the K-quants')


def _on(path: str, fn, *args):
    before = native.isa()
    native.set_isa(path)
    try:
        return fn(*args)
    finally:
        native.set_isa(before)


def _vectors(n: int, seed: int) -> torch.Tensor:
    """Normal values, a stretch of them spread over five decades, an all-zero block and exact ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    x[n // 2 :] *= torch.logspace(-3, 2, n - n // 2)[torch.randperm(n - n // 2, generator=g)]
    x[:32] = 0.0  # an all-zero block
    x[32:64] = torch.arange(32) - 15.5  # halves after scaling: ties
    return x


@pytest.mark.parametrize("path", paths()[1:])
def test_every_vector_path_computes_the_portable_bits(path):
    for seed, n in ((0, 1536), (1, 896), (2, 8960), (3, 1000)):
        x, up = _vectors(n, seed), _vectors(n, seed + 10)
        k = n // 32 * 32
        rows = x[None, :k]
        assert torch.equal(_on(path, native.quantize, Q8_0, rows), _on("scalar", native.quantize, Q8_0, rows))
        rows = x[None, : n // 256 * 256]
        assert torch.equal(_on(path, native.quantize, Q4_K, rows), _on("scalar", native.quantize, Q4_K, rows))
        assert _on(path, native.sum_squares, x) == _on("scalar", native.sum_squares, x)
        assert torch.equal(_on(path, native.swiglu, x, up), _on("scalar", native.swiglu, x, up))


def test_the_definitions_match_float64():
    x, up = _vectors(1000, 5), _vectors(1000, 6)
    x64, up64 = x.double(), up.double()
    assert native.sum_squares(x) == pytest.approx(float((x64 * x64).sum()), rel=1e-6)
    expected = x64 / (1 + torch.exp(-x64)) * up64
    assert torch.allclose(native.swiglu(x, up).double(), expected, rtol=1e-5, atol=1e-30)
    layout = np.dtype([("d", "<f4"), ("half", "<i2", 2), ("q", "i1", 32)])
    blocks = native.quantize(Q8_0, x[None, :992]).numpy().view(layout)
    values = blocks["q"].astype(np.float64) * blocks["d"][..., None]
    error = np.abs(values.reshape(-1) - x64[:992].numpy())
    assert (error <= blocks["d"].repeat(32) * 0.5 * (1 + 1e-6) + 1e-30).all()
    assert (blocks["half"] == blocks["q"].reshape(-1, 2, 16).sum(-1)).all()
    layout = np.dtype([("d", "<f4"), ("bsum", "<i2", 16), ("sum32", "<i2", 8), ("q", "i1", 256)])
    blocks = native.quantize(Q4_K, x[None, :768]).numpy().view(layout)
    values = blocks["q"].astype(np.float64) * blocks["d"][..., None]
    error = np.abs(values.reshape(-1) - x64[:768].numpy())
    assert (error <= blocks["d"].repeat(256) * 0.5 * (1 + 1e-6) + 1e-30).all()
    assert (blocks["d"] == np.abs(x[:768].numpy()).reshape(3, 256).max(-1) / np.float32(127)).all()
    assert (blocks["bsum"] == blocks["q"].reshape(-1, 16, 16).sum(-1)).all()
    assert (blocks["sum32"] == blocks["q"].reshape(-1, 8, 32).sum(-1)).all()


def test_the_sum_of_squares_order_is_its_own_and_an_index_order_sum_differs():
    """The bit comparisons above can fail: summing in index order gives other bits on these vectors."""
    differs = 0
    for seed in range(20):
        x = _vectors(1536, 100 + seed)
        ordered = torch.tensor(0.0)
        for value in x:
            ordered = ordered + value * value
        differs += float(ordered) != native.sum_squares(x)
    assert differs > 0


@pytest.mark.parametrize("path", paths())
def test_argmax_is_torchs_first_maximum_and_first_nan(path):
    g = torch.Generator().manual_seed(3)
    cases = [torch.randn(n, generator=g) for n in (1, 7, 8, 9, 65536 + 5)]
    ties = torch.randn(1000, generator=g)
    ties[[17, 400, 999]] = 50.0  # the first of equal maxima
    lows = torch.full((37,), float("-inf"))  # nothing but -inf: index 0
    zeros = torch.tensor([-0.0, 0.0, -1.0])  # -0 and 0 are equal: the first
    nans = torch.randn(300, generator=g)
    nans[[5, 250]] = float("nan")  # torch takes the first NaN as the largest
    tail_nan = torch.randn(13, generator=g)
    tail_nan[12] = float("nan")  # past the last full vector
    late_max = torch.randn(1003, generator=g)
    late_max[1001] = 99.0  # in the tail
    for x in (*cases, ties, lows, zeros, nans, tail_nan, late_max):
        assert _on(path, native.argmax, x) == int(torch.argmax(x)), (path, x.numel())


def test_argmax_rows_is_torchs_argmax_over_the_last_dimension():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 1001, generator=g)
    x[0, 1, [10, 900]] = 9.0  # ties: the first
    x[1, 2, 77] = float("nan")
    assert torch.equal(native.argmax_rows(x), x.argmax(-1))
    wide = torch.randn(5, 2000, generator=g)[:, ::2]  # not contiguous
    assert torch.equal(native.argmax_rows(wide), wide.argmax(-1))
    assert torch.equal(native.argmax_rows(x.double()), x.double().argmax(-1))  # other dtypes: torch's own
