"""Weight-only int4/int8: exact GGUF 4-bit mapping, row-invariant kernels, greedy identity in the format."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from test_generator_tiny import PROMPTS

from verispec import SpeculativeGenerator, load_model
from verispec.models.quantize import QuantizedLinear, int4_from_gguf, quantize_model, quantized_entries
from verispec.testing import tiny_loaded, tiny_pair


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1])
def test_gguf_4bit_blocks_map_to_int4_exactly(qtype):
    rows, cols = 48, 128
    weights = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    data = quantize(weights, qtype)
    expected = dequantize(data, qtype).reshape(rows, cols)
    got = int4_from_gguf(data, qtype, rows, cols).dequantize().numpy()
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("mode", ["int4-all", "int8"])
def test_quantized_linear_rows_do_not_depend_on_the_batch(mode):
    torch.manual_seed(0)
    weight = torch.randn(80, 96)
    linear = QuantizedLinear(96, 80, 4 if mode == "int4-all" else 8, bias=False)
    for key, value in quantized_entries([weight], mode).items():
        setattr(linear, key, value)
    x = torch.randn(9, 96)
    together = linear(x)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(9)])
    assert torch.equal(together, alone)
    relative = (together.float() - x @ weight.T).norm() / (x @ weight.T).norm()
    assert relative < (0.1 if mode == "int4-all" else 0.02)


@pytest.mark.parametrize("mode", ["int4-all", "int8"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_quantized_greedy_speculative_equals_plain_bit_for_bit(mode, k):
    target, draft = tiny_pair()
    qtarget = tiny_loaded(quantize_model(target.model, mode), target.tokenizer)
    qdraft = tiny_loaded(quantize_model(draft.model, "int4-all"), target.tokenizer)
    generator = SpeculativeGenerator(qtarget, qdraft, num_speculative_tokens=k, adaptive=False)
    plain = SpeculativeGenerator(qtarget, None)  # the reference: plain decoding of the same weights
    for prompt in PROMPTS:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=40)
        assert out.token_ids == plain.generate(ids, max_tokens=40).token_ids
        assert 0 < out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("rows", [16, 48, 64, 80, 144, 208])
def test_int4_unpacking_inverts_pytorchs_packing(rows):
    from verispec.models.quantize import _unpack_int4

    q = torch.randint(0, 16, (rows, 96), dtype=torch.int32, generator=torch.Generator().manual_seed(rows))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    assert torch.equal(_unpack_int4(packed, 96).to(torch.int32), q)


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_int4_unpacking_follows_the_packer_of_each_cpu_capability(capability):
    # PyTorch packs int4 differently per CPU capability; a lower one can be forced through the environment.
    script = (
        "import torch; from verispec.models.quantize import _unpack_int4\n"
        "q = torch.randint(0, 16, (208, 96), dtype=torch.int32, generator=torch.Generator().manual_seed(1))\n"
        "packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)\n"
        "assert torch.equal(_unpack_int4(packed, 96).to(torch.int32), q)\n"
        "print(torch.backends.cpu.get_cpu_capability())\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    if run.stdout.strip().lower() != capability:
        pytest.skip(f"this CPU cannot run PyTorch's {capability} kernels")


def test_int8_weights_loaded_from_the_cache_are_aligned(tmp_path, monkeypatch):
    """PyTorch's int8 kernel crashed (segfault) on a pass over 4 rows or more when its weight sat 8 bytes past a
    multiple of 16, as a weight memory-mapped from a cached safetensors shard may (this file's did: 4 of its 5):
    loading copies such weights to aligned memory."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    path = Path(__file__).parent / "fixtures" / "llamacpp" / "llama-q-q2_k.gguf"
    model = load_model(path, quantization="int8", progress=False).model
    weights = [m.qweight for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert len(weights) == 5 and all(w.data_ptr() % 64 == 0 for w in weights)
    logits = model(torch.arange(3, 19)[None], model.new_cache(max_len=16), [0])  # 16 rows
    assert torch.isfinite(logits).all()


def test_quantized_buffers_read_from_a_shard_are_aligned_for_the_kernels():
    """A safetensors shard aligns tensors to 8 bytes; PyTorch's int8 product crashed on weights 8 bytes off a
    16-byte boundary (a shard whose header length put them there). The loader re-homes such buffers."""
    from verispec.models.gguf_converted import _aligned

    entries = quantized_entries([torch.randn(64, 32)], "int8")
    room = torch.zeros(entries["qweight"].numel() + 64, dtype=torch.int8)
    start = (-room.data_ptr() + 8) % 64  # a view 8 bytes past a 64-byte boundary
    view = room[start : start + entries["qweight"].numel()].view(64, 32)
    view.copy_(entries["qweight"])
    assert view.data_ptr() % 64 == 8
    weight = _aligned("layers.0.attn.wqkv.qweight", view)
    assert weight.data_ptr() % 64 == 0 and torch.equal(weight, entries["qweight"])
    assert _aligned("embed.weight", view) is view  # other tensors stay where they are mapped
    linear = QuantizedLinear(32, 64, 8, bias=False)
    linear.qweight, linear.qscales = weight, entries["qscales"]
    assert linear(torch.randn(8, 32)).shape == (8, 64)
