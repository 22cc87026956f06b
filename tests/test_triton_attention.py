"""The fused shaped attention (kernels/triton_attention.py) on the CPU, under Triton's interpreter (tests/conftest.py
sets TRITON_INTERPRET=1 where no GPU is): it computes what the written-out attention computes (windows, sinks, token
trees, older keys past a block), a row's bits are the same in every pass and whatever the other groups reach (the
negative control: the same kernel with tiles that begin where the group's reach does), speculative output is plain
output to every logprob's bit; soft-capped models keep the written-out attention. On a GPU, tests/test_cuda.py runs
the compiled kernel (the default there). Small models: the interpreter runs each program in Python."""

import os
import subprocess
import sys

import pytest
import torch
from test_pass_shape import passes, same_bits

from verispec import SpeculativeGenerator
from verispec.engine.fixed_acceptance import fixed_acceptance
from verispec.errors import InvalidParameterError
from verispec.kernels import triton_attention
from verispec.models.pass_shape import PassShape, use_pass_shape
from verispec.models.shaped_attention import KEY_BLOCK, RECENT, ShapedPages
from verispec.testing import byte_tokenizer, tiny_config, tiny_loaded, tiny_model

pytestmark = pytest.mark.skipif(not triton_attention.available(), reason="Triton is not installed (pip install -e "
                                '".[test]" brings it)')  # fmt: skip

CONFIG = dict(vocab_size=257, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


def model(shape: PassShape | None, fused: bool, **overrides):
    made = tiny_model(tiny_config(**{**CONFIG, **overrides}), seed=1, scale=2.0, residual_gain=0.3)
    use_pass_shape(made, shape, fused=fused)
    return made


def close(runs: dict, expected: dict) -> None:
    for name in runs:
        for a, b in zip(runs[name], expected[name], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_the_kernel_runs_and_agrees_with_plain_attention_here():
    assert triton_attention.usable("cpu", torch.float32, (64, 128))
    assert triton_attention.usable("cpu", torch.bfloat16, (64,))


@pytest.mark.parametrize(
    "overrides",
    [{}, {"layer_windows": (18, 0), "attn_sinks": True}],
    ids=["plain", "windows-and-sinks"],
)
def test_a_rows_logits_are_the_same_bits_in_every_pass_and_the_written_out_attentions_to_rounding(overrides):
    ids = torch.randint(0, 257, (1, 24), generator=torch.Generator().manual_seed(0))
    fused = model(PassShape(groups=2, width=4), True, **overrides)
    assert fused.pass_fused
    runs = passes(fused, ids, context=20, steps=4)
    assert same_bits(runs)
    close(runs, passes(model(PassShape(groups=2, width=4), False, **overrides), ids, context=20, steps=4))


def test_token_trees_through_the_kernel_compute_what_ordinary_passes_compute():
    """Two slots' trees, a node's ancestors spread over groups of width 3: the logits of ordinary passes."""
    ids = torch.randint(0, 257, (2, 14), generator=torch.Generator().manual_seed(2))
    parents = [[-1, 0, 1, 0, 3, 1], [-1, -1, 1, 1, 2, 4]]
    results = []
    for made in (model(None, False), model(PassShape(groups=2, width=3), True)):
        cache = made.new_cache(num_slots=2, max_len=32)
        made(ids[:, :8], cache, [0, 1])
        results.append(made(ids[:, 8:14], cache, [0, 1], parents=parents))
    torch.testing.assert_close(results[0], results[1], rtol=1e-4, atol=1e-4)


class Layer:  # what the kernel reads of an Attention
    num_kv_heads, scale, window, softcap, sinks = 2, 0.125, 0, None, None


BLOCK_SIZE = 16


def kernel_inputs(read: torch.Tensor, far: int, near: int = 40) -> dict:
    """The kernel's inputs for two groups of 2 rows: group 0's at positions `near` and the next (by default older keys
    in its first two tiles), group 1's at `far` (its older keys reaching as far); as many blocks of older keys as the
    further group needs."""
    positions = torch.tensor([[near, near + 1], [far, far]], device=read.device)
    recent_position = positions[..., None] + torch.arange(1 - RECENT, 1, device=read.device)
    recent_block = read.gather(1, (recent_position // BLOCK_SIZE).flatten(1)).view_as(recent_position)
    return dict(read=read, older_limit=positions - RECENT + 1, positions=positions, recent_block=recent_block,
                recent_row=recent_position % BLOCK_SIZE, recent_position=recent_position,
                span=-(-max(near + 1, far) // KEY_BLOCK) * KEY_BLOCK, block_size=BLOCK_SIZE)  # fmt: skip


def test_a_row_gets_the_same_bits_whatever_the_other_groups_reach(monkeypatch):
    """Group 0's rows beside a group reaching 100 keys (one block of older keys read), then beside one reaching past
    the first block (two read): the same bits, and the written-out attention's to rounding. The control: tiles of
    another size in the second pass give group 0 other bits, so the comparison sees a tiling that changes."""
    gen = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(4 * KEY_BLOCK // BLOCK_SIZE, 2, BLOCK_SIZE, 32, generator=gen) for _ in range(2))
    q = torch.randn(2, 2, 4, 32, generator=gen)
    read = torch.arange(keys.shape[0]).view(2, -1)
    near, far = kernel_inputs(read, 100), kernel_inputs(read, KEY_BLOCK + 300)
    alone = triton_attention.attend(Layer(), q, keys, values, **near)
    assert torch.equal(alone[0], triton_attention.attend(Layer(), q, keys, values, **far)[0])
    written = ShapedPages(written=(), **_written_out(near)).attend(Layer(), q, keys, values)
    torch.testing.assert_close(alone, written, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(triton_attention, "TILE", 16)
    assert not torch.equal(alone[0], triton_attention.attend(Layer(), q, keys, values, **far)[0])


def test_a_row_past_the_first_chunk_gets_the_same_bits_whatever_the_other_groups_reach(monkeypatch):
    """Group 0's rows reaching past the first CHUNK older positions (their keys split into chunks, each chunk's state
    computed by a program of its own, then merged) beside a group reaching 100 keys, then beside one reaching past two
    chunks: the same bits, and plain attention's to rounding. The control: chunks of another size give them other
    bits, so the comparison sees a chunking that changes."""
    assert triton_attention.CHUNK == KEY_BLOCK  # a pass reads whole key blocks: one of them is walked, never split
    gen = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(6 * KEY_BLOCK // BLOCK_SIZE, 2, BLOCK_SIZE, 32, generator=gen) for _ in range(2))
    q = torch.randn(2, 2, 4, 32, generator=gen)
    read = torch.arange(keys.shape[0]).view(2, -1)
    near = KEY_BLOCK + 200
    beside_short, beside_long = kernel_inputs(read, 100, near=near), kernel_inputs(read, 2 * KEY_BLOCK + 300, near=near)
    split = triton_attention.attend(Layer(), q, keys, values, **beside_short)
    assert torch.equal(split[0], triton_attention.attend(Layer(), q, keys, values, **beside_long)[0])
    expected = triton_attention._reference(q, keys, values, read=read, positions=beside_short["positions"],
                                           block_size=BLOCK_SIZE, scale=Layer.scale)  # fmt: skip
    torch.testing.assert_close(split, expected, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(triton_attention, "CHUNK", KEY_BLOCK // 2)
    assert not torch.equal(split[0], triton_attention.attend(Layer(), q, keys, values, **beside_long)[0])


def _written_out(inputs: dict) -> dict:
    """ShapedPages' written-out form of the kernel's inputs (pass_shape.ShapedPasses._pages)."""
    span, read, block_size = inputs["span"], inputs["read"], inputs["block_size"]
    keys = torch.arange(span)
    per = KEY_BLOCK // block_size
    return dict(
        older_blocks=[read[:, b * per : (b + 1) * per].repeat_interleave(block_size, dim=1)
                      for b in range(span // KEY_BLOCK)],
        older_rows=keys[:KEY_BLOCK] % block_size,
        older={0: keys[None, None, :] >= inputs["older_limit"][:, :, None]},
        recent_block=inputs["recent_block"], recent_row=inputs["recent_row"],
        recent={0: inputs["recent_position"] < 0}, heads=torch.arange(2),
    )  # fmt: skip


def test_a_soft_capped_model_keeps_the_written_out_attention():
    assert not model(PassShape(groups=2, width=4), True, attn_softcap=50.0).pass_fused


def test_the_kernel_is_taken_where_asked_and_on_cuda_only_by_default(monkeypatch):
    monkeypatch.delenv("VERISPEC_FUSED_ATTENTION", raising=False)
    assert not model(PassShape(groups=2, width=4), None).pass_fused  # a CPU: off unless asked
    monkeypatch.setenv("VERISPEC_FUSED_ATTENTION", "1")
    assert model(PassShape(groups=2, width=4), None).pass_fused
    assert not model(None, None).pass_fused
    monkeypatch.setenv("VERISPEC_FUSED_ATTENTION", "0")
    assert not model(PassShape(groups=2, width=4), None).pass_fused
    monkeypatch.setenv("VERISPEC_FUSED_ATTENTION", "yes")
    with pytest.raises(InvalidParameterError, match="VERISPEC_FUSED_ATTENTION='yes': use 1"):
        model(PassShape(groups=2, width=4), None)


def test_speculative_output_through_the_kernel_is_plain_output_to_every_logprobs_bit(monkeypatch):
    """Drafts of fixed acceptance as token trees (a node's ancestors found by the kernel's recent keys), verified at
    2x4 through the engine, against plain decoding at 2x4: the same tokens and logprobs, the kernel taken by both. The
    control, that ordinary passes differ in the last bits: tests/test_pass_shape.py."""
    monkeypatch.setenv("VERISPEC_FUSED_ATTENTION", "1")
    made = model(None, False)
    target = tiny_loaded(made, byte_tokenizer(), "t")
    prompt = "def add(a, b):"
    plain = SpeculativeGenerator(target, None, pass_shape="2x4", max_seq_len=64)
    expected = plain.generate(prompt, max_tokens=12, ignore_eos=True, logprobs=0)
    assert made.pass_fused
    with fixed_acceptance([target.tokenizer.encode(prompt) + expected.token_ids], 0.6, tree=True) as oracle:
        spec = SpeculativeGenerator(target, None, pass_shape="2x4", max_seq_len=64, speculative_method=oracle,
                                    num_speculative_tokens=4, adaptive=False, token_trees=True)  # fmt: skip
        out = spec.generate(prompt, max_tokens=12, ignore_eos=True, logprobs=0)
    assert made.pass_fused
    assert out.token_ids == expected.token_ids
    assert [e.logprob for e in out.logprobs] == [e.logprob for e in expected.logprobs]
    assert 0 < out.stats.accepted < out.stats.drafted


COMPILE = """
import inspect, subprocess, sys
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from verispec.kernels import triton_attention, triton_attention_kernel

arch, size, group, recent = (int(sys.argv[i]) for i in (1, 2, 3, 5))
windowed, folder = sys.argv[4] == "1", Path(sys.argv[6])
floats, halves = {"top_ptr", "total_ptr", "state_ptr"}, {"q_ptr", "k_ptr", "v_ptr", "out_ptr", "sinks_ptr"}
shapes = dict(WIDTH=8, GROUP=group, ROWS=triton_attention.ROWS, SIZE=size, D=size, BLOCK_SIZE=64,
              TILE=triton_attention.TILE, CHUNK=triton_attention.CHUNK, RECENT=recent, WINDOWED=windowed,
              SINKS=windowed)
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
for name, split in (("attention", False), ("attention", True), ("chunk", False)):  # walking; merging; a chunk
    kernel, shapes["SPLIT"] = getattr(triton_attention_kernel, name), split
    parameters = inspect.signature(kernel.fn).parameters
    signature = {p: "*fp32" if p in floats else "*bf16" if p in halves else "*i64" if p.endswith("_ptr")
                 else "fp32" if p == "scale" else "constexpr" if p.isupper() else "i32" for p in parameters}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature,
                                        constexprs={p: shapes[p] for p in parameters if p.isupper()}),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": triton_attention.WARPS})
    ptx = folder / f"{name}{int(split)}.ptx"
    ptx.write_text(compiled.asm["ptx"])
    # the architecture the PTX names (Hopper's with its own instructions: sm_90a)
    target = compiled.asm["ptx"].split(".target ", 1)[1].split()[0].rstrip(",")
    report = subprocess.run([ptxas, f"-arch={target}", "-v", ptx, "-o", ptx.with_suffix(".o")], capture_output=True,
                            text=True, check=True)
    print(name, report.stdout + report.stderr)
"""


@pytest.mark.parametrize("arch", [80, 90], ids=["ampere", "hopper"])
@pytest.mark.parametrize("size, group, windowed", [(128, 7, False), (64, 7, False), (64, 8, True)],
                         ids=["7b", "0.5b", "windows-and-sinks"])  # fmt: skip
def test_the_kernel_compiles_for_the_cards_it_is_for_without_spilling_registers(arch, size, group, windowed,
                                                                                tmp_path):  # fmt: skip
    """Compiled for an A100's and an H100's architecture here, without a GPU (Triton's compiler and its bundled
    ptxas, in a process of its own: this one interprets Triton), at the default pass shape's layouts (Qwen2.5-7B's 7
    query heads a kv head of 128 values; 0.5B's of 64; windows and sinks): no error, and no register spilled to
    memory (ptxas -v)."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    arguments = [str(n) for n in (arch, size, group, int(windowed), RECENT)] + [str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", COMPILE, *arguments], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" 0 bytes spill stores") == 3, done.stdout  # walking, merging, a chunk


@pytest.mark.slow
def test_compiled_passes_with_the_fused_attention_keep_a_rows_bits_in_every_pass_tapped_or_not():
    """torch.compile's regions around the kernel (an operation of its own to them, verispec::shaped_attention): a
    row's logits the same bits in every pass, and in a pass tapping layers for served hidden states. The control:
    compiled logits are not the eager fused pass's bits, so each check compares two compilations."""
    ids = torch.randint(0, 257, (1, 24), generator=torch.Generator().manual_seed(0))

    def compiled():
        made = model(None, False)
        use_pass_shape(made, PassShape(groups=2, width=4), compiled=True, fused=True)
        assert made.pass_fused
        return made

    runs = passes(compiled(), ids, context=20, steps=4)
    assert same_bits(runs)
    eager = passes(model(PassShape(groups=2, width=4), True), ids, context=20, steps=4)
    assert not same_bits({"decoded": runs["decoded"], "eager": eager["decoded"]})
    tapping = compiled()
    tapping.serve_hidden(lambda *served: None, layers=(1, 2))
    assert same_bits({"decoded": runs["decoded"], "tapped": passes(tapping, ids, context=20, steps=4)["decoded"]})
