"""The native kernels against a float64 reference built from the `gguf` package's dequantization, on every
path this CPU runs, and their row independence (bit for bit, whatever the other rows are and however many)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from verispec.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not compiled")

QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
DENSE = ["F32", "F16", "BF16"]
TYPES = {name: GGMLQuantizationType[name] for name in QUANTIZED + DENSE}
# float16 fields per block
_HALF_OFFSETS = {2: (0,), 3: (0, 2), 6: (0,), 8: (0,), 20: (0,), 10: (80, 82), 11: (108,), 12: (0, 2), 13: (0, 2),
                 14: (208,), 23: (0,), 39: ()}  # fmt: skip


def paths() -> list[str]:
    return native.runnable_isas() if native.available() else []


@pytest.fixture(params=paths())
def path(request):
    before = native.isa()
    native.set_isa(request.param)
    yield request.param
    native.set_isa(before)


def random_blocks(qtype: int, rows: int, k: int, seed: int, scale: float = 0.02) -> np.ndarray:
    """[rows, row bytes] of random blocks: every bit pattern of the quantized fields, float16 scales in
    [-scale, scale]."""
    block, size = native.QUANT_TYPES[qtype]
    rng = np.random.default_rng(seed)
    if qtype in native.DENSE_TYPES:  # normal values, some tiny (float16's subnormals) and some exact zeros
        values = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        values[:, ::7] *= 1e-4
        values[:, ::11] = 0.0
        if qtype == GGMLQuantizationType.F16:
            return values.astype(np.float16).view(np.uint8).reshape(rows, -1)
        if qtype == GGMLQuantizationType.BF16:  # the upper half of each float32
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
        return values.view(np.uint8).reshape(rows, -1)
    data = rng.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    if qtype == GGMLQuantizationType.MXFP4:  # its E8M0 exponent: scales 2^-10 .. 2^-1 (levels up to 12)
        data[:, :, 0] = rng.integers(118, 128, size=(rows, k // block))
    for offset in _HALF_OFFSETS[qtype]:
        scales = rng.uniform(-scale, scale, size=(rows, k // block)).astype(np.float16)
        data[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(rows, k // block, 2)
    return data.reshape(rows, -1)


def dequantized(qtype: int, data: np.ndarray, k: int) -> np.ndarray:
    return dequantize(data, GGMLQuantizationType(qtype)).reshape(data.shape[0], k).astype(np.float64)


def activations_as_floats(qtype: int, xq: torch.Tensor, k: int) -> np.ndarray:
    """What the kernel multiplies by: each quantized activation block as q * d, in float64."""
    block = native.activation_block(qtype)
    if block == 1:  # the dense types' activations: the float32 rows themselves
        return xq.numpy().view(np.float32).astype(np.float64).reshape(xq.shape[0], k)
    if block == 32:
        layout = np.dtype([("d", "<f4"), ("half", "<i2", 2), ("q", "i1", 32)])
    else:
        layout = np.dtype([("d", "<f4"), ("bsum", "<i2", 16), ("sum32", "<i2", 8), ("q", "i1", 256)])
    blocks = xq.numpy().view(layout).reshape(xq.shape[0], k // block)
    return (blocks["q"].astype(np.float64) * blocks["d"].astype(np.float64)[..., None]).reshape(xq.shape[0], k)


def within_tolerance(got: np.ndarray, x_used: np.ndarray, w: np.ndarray) -> bool:
    """Whether a product `got` is x_used @ w.T up to float32 accumulation (relative to the sum of magnitudes)."""
    error = np.abs(got - x_used @ w.T)
    return bool(np.all(error <= 2e-5 * (np.abs(x_used) @ np.abs(w).T) + 1e-6))


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 512), (5, 64, 256), (17, 24, 768)])
def test_products_match_the_float64_reference(path, name, m, n, k):
    qtype = int(TYPES[name])
    weight = random_blocks(qtype, n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)) * 3
    xq = native.quantize(qtype, x)
    x_used = activations_as_floats(qtype, xq, k)
    # the activations' 8-bit rounding: within half a step of each block's scale
    block = native.QUANT_TYPES[qtype][0]
    step = np.abs(x.numpy()).reshape(m, -1, block).max(-1, keepdims=True) / 127
    assert np.all(np.abs(x_used - x.numpy()).reshape(m, -1, block) <= step / 2 * 1.0001 + 1e-7)
    w = dequantized(qtype, weight, k)
    got = native.matmul(qtype, torch.from_numpy(weight), xq, k).numpy()
    assert within_tolerance(got, x_used, w), (name, path, np.abs(got - x_used @ w.T).max())
    assert torch.equal(native.linear(qtype, torch.from_numpy(weight), x), torch.from_numpy(got))


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize(("m", "k"), [(1, 512), (5, 100), (11, 896)])
def test_dense_products_are_the_same_bits_on_every_path(name, m, k):
    """The dense rule (16 lanes, a fixed tree, then the tail; every product rounded before it is added) is one
    definition: each vector path computes the portable path's bits, tails (k not a multiple of 16) included."""
    qtype = int(TYPES[name])
    weight = torch.from_numpy(random_blocks(qtype, 37, k, seed=k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    before = native.isa()
    try:
        results = []
        for each in paths():
            native.set_isa(each)
            results.append(native.linear(qtype, weight, x))
    finally:
        native.set_isa(before)
    assert all(torch.equal(r, results[0]) for r in results[1:])


# a byte of each type's first block that holds weight values (not scales), for the negative control
_VALUE_BYTE = {"Q4_0": 5, "Q4_1": 7, "Q5_0": 9, "Q8_0": 9, "IQ4_NL": 5, "Q2_K": 20, "Q3_K": 40, "Q4_K": 20,
               "Q5_K": 60, "Q6_K": 10, "IQ4_XS": 20}  # fmt: skip


def test_a_wrong_rule_fails_the_reference_check():
    """Negative control: dropping one sub-block's scale (a plausible unpacking bug) is far outside tolerance."""
    qtype, n, k = int(GGMLQuantizationType.Q4_K), 16, 256
    weight = random_blocks(qtype, n, k, seed=3)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(0))
    xq = native.quantize(qtype, x)
    w = dequantized(qtype, weight, k)
    w[:, 32:64] = 0.0  # the reference without sub-block 1
    expected = activations_as_floats(qtype, xq, k) @ w.T
    got = native.matmul(qtype, torch.from_numpy(weight), xq, k).numpy()
    assert np.abs(got - expected).max() > 1e-3 * np.abs(expected).max()


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("tiled", [False, True], ids=["rows", "tiles"])
def test_one_wrong_weight_per_row_fails_the_reference_check(path, name, tiled):
    """Negative control of the reference tests' tolerance, per type and form: a reference whose rows each differ
    from the weights in one bit of one value (a bit flipped in each row's first block) is caught, while the true
    reference passes."""
    qtype, n, k = int(TYPES[name]), 32, 512
    weight = random_blocks(qtype, n, k, seed=5)
    kind, data = native.repack(qtype, torch.from_numpy(weight), k) if tiled else (qtype, torch.from_numpy(weight))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1)) * 3
    xq = native.quantize(kind, x)
    got = native.matmul(kind, data, xq, k, n).numpy()
    x_used = activations_as_floats(kind, xq, k)
    assert within_tolerance(got, x_used, dequantized(qtype, weight, k))
    wrong = weight.copy()
    wrong[:, _VALUE_BYTE[name]] ^= 0x04
    assert not np.array_equal(dequantized(qtype, wrong, k), dequantized(qtype, weight, k))
    assert not within_tolerance(got, x_used, dequantized(qtype, wrong, k))


@pytest.mark.parametrize("name", list(TYPES))
def test_each_row_is_the_same_bits_whatever_shares_its_call(path, name):
    qtype, n, k = int(TYPES[name]), 40, 512
    weight = torch.from_numpy(random_blocks(qtype, n, k, seed=7))
    rows = torch.randn(16, k, generator=torch.Generator().manual_seed(1))
    alone = torch.cat([native.linear(qtype, weight, rows[i : i + 1]) for i in range(16)])
    for m in range(1, 17):
        assert torch.equal(native.linear(qtype, weight, rows[:m]), alone[:m]), m
    others = torch.randn(16, k, generator=torch.Generator().manual_seed(2)) * 100
    others[5] = rows[5]
    assert torch.equal(native.linear(qtype, weight, others)[5], alone[5])
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            native.set_threads(count)
            assert torch.equal(native.linear(qtype, weight, rows), alone), count
    finally:
        native.set_threads(threads)


# ---- tile forms (every quantized type repacked, 16 rows interleaved) -------------------------------------------------
TILED = QUANTIZED


@pytest.mark.parametrize("name", TILED)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 512), (5, 64, 256), (17, 24, 768), (3, 16, 1536)])
def test_tile_products_match_the_float64_reference(path, name, m, n, k):
    qtype = int(TYPES[name])
    weight = random_blocks(qtype, n, k, seed=m + n)
    tile, tiles = native.repack(qtype, torch.from_numpy(weight), k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)) * 3
    xq = native.quantize(tile, x)
    x_used, w = activations_as_floats(tile, xq, k), dequantized(qtype, weight, k)
    got = native.matmul(tile, tiles, xq, k, n).numpy()
    assert within_tolerance(got, x_used, w), (name, path, np.abs(got - x_used @ w.T).max())


@pytest.mark.parametrize("name", TILED)
def test_tile_products_at_the_activations_extremes_match_the_float64_reference(path, name):
    """Every activation at +-127 of its block's scale (one sign per 32 values): the integer sums are at their largest,
    where a kernel summing pairs in 16 bits (the AVX2 path) would wrap if it summed more than its bound allows."""
    qtype, n, k = int(TYPES[name]), 32, 1024
    weight = random_blocks(qtype, n, k, seed=11)
    tile, tiles = native.repack(qtype, torch.from_numpy(weight), k)
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0]).repeat_interleave(32).repeat(k // 128)
    x = torch.stack([signs, -signs, torch.ones(k)]) * 5
    xq = native.quantize(tile, x)
    x_used, w = activations_as_floats(tile, xq, k), dequantized(qtype, weight, k)
    got = native.matmul(tile, tiles, xq, k, n).numpy()
    assert within_tolerance(got, x_used, w), (name, path, np.abs(got - x_used @ w.T).max())


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q5_K", "IQ4_XS"])
def test_the_portable_tile_kernels_compute_the_row_kernels_bits(name):
    """The tile forms of these types are unpacked to the row layout's portable superblock and dotted by the same
    function (csrc/vsk_blocks.h): equal bits show the repacking lossless, rows past N included."""
    qtype, n, k = int(TYPES[name]), 37, 768
    weight = torch.from_numpy(random_blocks(qtype, n, k, seed=2))
    tile, tiles = native.repack(qtype, weight, k)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(3))
    before = native.isa()
    try:
        native.set_isa("scalar")
        assert torch.equal(native.linear(tile, tiles, x, n), native.linear(qtype, weight, x))
    finally:
        native.set_isa(before)


@pytest.mark.parametrize("name", TILED)
def test_tile_rows_are_the_same_bits_whatever_shares_their_call(path, name):
    qtype, n, k = int(TYPES[name]), 48, 512
    tile, tiles = native.repack(qtype, torch.from_numpy(random_blocks(qtype, n, k, seed=9)), k)
    rows = torch.randn(16, k, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([native.linear(tile, tiles, rows[i : i + 1], n) for i in range(16)])
    for m in range(1, 17):
        assert torch.equal(native.linear(tile, tiles, rows[:m], n), alone[:m]), m
    others = torch.randn(16, k, generator=torch.Generator().manual_seed(5)) * 100
    others[9] = rows[9]
    assert torch.equal(native.linear(tile, tiles, others, n)[9], alone[9])


def test_a_product_shared_among_threads_computes_every_chunk_once_whoever_takes_it():
    """Threads take grains of each other's shares when they finish early (vsk_core.c): whichever thread takes a
    chunk, every output is written with the bits of a single-threaded product. Repeated, since who takes what
    depends on timing; two inputs in turn, so that a chunk left unwritten cannot hold the right values by chance."""
    qtype = int(TYPES["Q4_K"])
    n, k = 16 * 150 + 5, 512
    tile, tiles = native.repack(qtype, torch.from_numpy(random_blocks(qtype, n, k, seed=11)), k)
    inputs = [torch.randn(3, k, generator=torch.Generator().manual_seed(seed)) for seed in (6, 7)]
    threads = torch.get_num_threads()
    try:
        native.set_threads(1)
        alone = [native.linear(tile, tiles, rows, n) for rows in inputs]
        for count in (2, 3, 5):
            native.set_threads(count)
            for i in range(40):
                assert torch.equal(native.linear(tile, tiles, inputs[i % 2], n), alone[i % 2]), count
    finally:
        native.set_threads(threads)


def test_the_python_tables_of_the_forms_are_the_c_table():
    """native.QUANT_TYPES and TILE_OF list the forms of csrc/vsk_forms.h (the one table), with their blocks' sizes."""
    header = (Path(native.__file__).parent / "csrc" / "vsk_forms.h").read_text(encoding="utf-8")
    lines = re.findall(r"X\((\w+), \w+, (\d+), (\d+), (\d+), \w+\)", header)  # a type: name, id, values, bytes
    types = {name: (int(i), int(w), int(b)) for name, i, w, b in lines}
    tiles = re.findall(r"X\((\w+), \w+, (\w+), \d+, \w+\)", header)  # a tile form: name, its type's name
    assert len(types) == 15 and len(tiles) == 11
    assert {i: (w, b) for i, w, b in types.values()} == native.QUANT_TYPES
    assert {types[name][0]: 100 + types[name][0] for _, name in tiles} == native.TILE_OF
    assert {i for i, w, _ in types.values() if w == 1} == set(native.DENSE_TYPES)


def test_a_native_linear_of_mixed_parts_equals_its_dequantized_matrix():
    """Fused layers (q/k/v, gate/up) stack parts of different block types, plus a bias."""
    from verispec.kernels.linear import NativeLinear

    k = 512
    shapes = (("Q4_K", 48), ("Q5_0", 20), ("Q6_K", 16), ("Q8_0", 8), ("Q4_0", 12), ("Q4_1", 12), ("Q5_K", 20),
              ("Q3_K", 16), ("Q2_K", 12), ("IQ4_XS", 24), ("IQ4_NL", 4))  # fmt: skip
    parts = [(int(TYPES[name]), torch.from_numpy(random_blocks(int(TYPES[name]), rows, k, seed=rows)))
             for name, rows in shapes]  # fmt: skip
    out = sum(rows for _, rows in shapes)
    bias = torch.randn(out)
    layer = NativeLinear(k, parts, bias)
    assert [kind for kind, _ in layer.kernels] == [100 + qtype for qtype, _ in parts]  # every part in its tile form
    x = torch.randn(3, 2, k, generator=torch.Generator().manual_seed(0))
    w = np.concatenate([dequantized(qtype, weight.numpy(), k) for qtype, weight in parts])
    expected = x.reshape(6, k).double().numpy() @ w.T + bias.double().numpy()
    got = layer(x)
    assert got.shape == (3, 2, out)
    assert np.abs(got.reshape(6, out).double().numpy() - expected).max() < 0.02 * np.abs(expected).max()
    rows = torch.tensor([0, 5, 47])
    head = NativeLinear(k, parts[:1], bias[:48]).select_rows(rows)
    assert torch.equal(head(x), NativeLinear(k, parts[:1], bias[:48])(x)[..., rows])


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K", "Q5_K", "F16", "BF16", "Q4_0", "IQ4_XS"])
def test_rows_requantized_to_q4_0_are_ggmls_reference_rounding(name):
    """A draft head's rows made coarser (select_rows(at_most_q4_0=True)): ggml's Q4_0 reference rounding of the
    dequantized rows, bit for bit as the `gguf` package writes it, and only for rows stored wider than Q4_0."""
    from gguf.quants import quantize

    from verispec.kernels.linear import NativeLinear

    qtype, k = int(TYPES[name]), 512
    weight = torch.from_numpy(random_blocks(qtype, 40, k, seed=3))
    rows = torch.tensor([39, 0, 7, 7])
    expected = quantize(dequantized(qtype, weight.numpy()[rows.numpy()], k).astype(np.float32), TYPES["Q4_0"])
    assert np.array_equal(native.requantize_q4_0(qtype, weight, rows, k).numpy(), expected)
    head = NativeLinear(k, [(qtype, weight)]).select_rows(rows, at_most_q4_0=True)
    kept = name in ("Q4_0", "IQ4_XS")  # stored in fewer bytes than Q4_0 already
    assert head.source[0][0] == (qtype if kept else int(TYPES["Q4_0"]))
    assert torch.equal(head.source[0][1], weight[rows] if kept else torch.from_numpy(expected))


def test_half_precision_rounds_to_nearest_even_as_numpy():
    """The float16 scales the requantization writes: every float32 near the float16 grid (halfway cases, the
    subnormals, overflow) converts as numpy converts."""
    from gguf.quants import quantize

    grid = np.arange(0, 0x7C00, 7, dtype=np.uint16).view(np.float16).astype(np.float32)
    halfway = (grid[:-1] + grid[1:]) / 2  # ties round to even
    values = np.concatenate([grid, halfway, np.nextafter(halfway, 0), np.nextafter(halfway, 1), [65520.0, 1e-8]])
    values = np.concatenate([values, -values, np.zeros(-2 * len(values) % 16)]).astype(np.float32)
    blocks = np.zeros((len(values), 32), dtype=np.float32)  # 16 blocks to a row of 512
    blocks[:, 0] = values * -8  # each block's d is its largest value / -8: the value itself
    rows = torch.from_numpy(blocks.reshape(-1, 512))  # F32 rows of 512
    ids = torch.arange(rows.shape[0])
    got = native.requantize_q4_0(0, rows.view(torch.uint8).reshape(rows.shape[0], -1), ids, 512).numpy()
    with np.errstate(over="ignore"):  # 65520 rounds to infinity, as it should
        expected = quantize(blocks.reshape(-1, 512), GGMLQuantizationType.Q4_0)
    assert np.array_equal(got.reshape(-1, 18)[:, :2], expected.reshape(-1, 18)[:, :2])


# ---- choosing the path, and the fallback without a compiled library -------------------------------------
@pytest.fixture
def fresh_library(monkeypatch):
    """library() re-read under the test's environment, and restored afterwards."""
    isa_before = native.isa()
    native.library.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    native.library.cache_clear()
    native.set_isa(isa_before)


def test_without_the_compiled_library_auto_runs_pytorch_and_says_so_once(fresh_library, capsys):
    from verispec.models.weight_forms import resolve_quantization

    fresh_library.setattr(native, "library_path", lambda: None)
    assert not native.available() and native.isa() == "torch"
    assert resolve_quantization("auto", "cpu", dtype_chosen=False) == "int4"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "PyTorch" in warnings[0]


def test_verispec_kernels_forces_a_path(fresh_library):
    from verispec.errors import InvalidParameterError

    fresh_library.setenv("VERISPEC_KERNELS", "scalar")
    assert native.isa() == "scalar"
    native.library.cache_clear()
    fresh_library.setenv("VERISPEC_KERNELS", "torch")
    assert not native.available()
    native.library.cache_clear()
    fresh_library.setenv("VERISPEC_KERNELS", "sse9")
    with pytest.raises(InvalidParameterError, match="VERISPEC_KERNELS"):
        native.library()


# ---- attention of decode and verify passes ---------------------------------------------------------------
def _attention_reference(q, keys, values, start, scale):
    s, h, d = q.shape
    group = h // keys.shape[0]
    out = torch.empty(s, h, d, dtype=torch.float64)
    for m in range(s):
        for head in range(h):
            k, v = keys[head // group, : start + m + 1].double(), values[head // group, : start + m + 1].double()
            p = torch.softmax(k @ q[m, head].double() * scale, dim=0)
            out[m, head] = p @ v
    return out


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "start"),
    [(6, 2, 16, 21), (6, 2, 16, 61), (8, 2, 32, 29), (12, 2, 128, 62), (14, 2, 64, 5)],
    ids=["group3-d16", "group3-d16-tiles", "group4-d32", "group6-d128-tiles", "group7-d64"],
)
def test_attention_matches_the_reference_and_each_query_only_its_own_prefix(path, heads, kv_heads, d, start):
    """Head sizes that take each vector width of the kernels, groups that fill their queries per load and
    overflow them, and spans that cross the tiles of 32 positions."""
    g = torch.Generator().manual_seed(0)
    length = start + 19
    keys, values = torch.randn(kv_heads, length, d, generator=g), torch.randn(kv_heads, length, d, generator=g)
    q = torch.randn(5, heads, d, generator=g)
    got = native.attention(q, keys, values, start, d**-0.5)
    assert torch.allclose(got.double(), _attention_reference(q, keys, values, start, d**-0.5), atol=1e-5)
    # bit for bit the same alone (a decode step) as beside the others (a verify pass)
    for m in range(5):
        alone = native.attention(q[m : m + 1], keys, values, start + m, d**-0.5)
        assert torch.equal(alone[0], got[m]), m
    # positions past a query's own are never read
    poisoned_keys, poisoned_values = keys.clone(), values.clone()
    poisoned_keys[:, start + 1 :], poisoned_values[:, start + 1 :] = float("nan"), float("nan")
    assert torch.equal(native.attention(q[:1], poisoned_keys, poisoned_values, start, d**-0.5)[0], got[0])


@pytest.mark.parametrize("name", list(TYPES))
def test_embedding_rows_are_the_gguf_packages_bits(name):
    from verispec.kernels.linear import GGUFEmbedding

    k, rows = 512, 40
    qtype, data = int(TYPES[name]), random_blocks(int(TYPES[name]), rows, k, seed=7)
    assert native.has_rows_to_floats(qtype)
    ids = torch.tensor([[3, 0, 39], [39, 17, 3]])
    got = GGUFEmbedding(qtype, torch.from_numpy(data), k)(ids)
    expected = dequantize(data[ids.reshape(-1).numpy()], GGMLQuantizationType(qtype)).reshape(2, 3, k)
    assert got.shape == (2, 3, k)
    assert np.array_equal(got.numpy(), expected.astype(np.float32))
    with pytest.raises(IndexError):
        GGUFEmbedding(qtype, torch.from_numpy(data), k)(torch.tensor([[rows]]))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 512), (5, 64, 256), (17, 24, 768)])
def test_mxfp4_products_are_ggmls_integer_sums_and_a_wrong_weight_is_caught(path, m, n, k):
    """MXFP4 (gpt-oss's experts; row kernels, no tile form): within the float64 reference of its dequantized weights
    (the gguf package's) times the activations as quantized; a reference with one nibble's bit flipped per row is
    caught; each row's bits are its own whatever shares the call."""
    qtype = int(GGMLQuantizationType.MXFP4)
    weight = random_blocks(qtype, n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)) * 3
    xq = native.quantize(qtype, x)
    x_used, w = activations_as_floats(qtype, xq, k), dequantized(qtype, weight, k)
    got = native.matmul(qtype, torch.from_numpy(weight), xq, k).numpy()
    assert within_tolerance(got, x_used, w), (path, np.abs(got - x_used @ w.T).max())
    wrong = weight.copy()
    wrong[:, 1] ^= 0x04  # the first block's first weight: level 4 <-> 0, 1 <-> 3 ...
    assert not within_tolerance(got, x_used, dequantized(qtype, wrong, k))
    alone = torch.cat([native.linear(qtype, torch.from_numpy(weight), x[i : i + 1]) for i in range(m)])
    assert torch.equal(alone, native.linear(qtype, torch.from_numpy(weight), x))
