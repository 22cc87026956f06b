"""How many kernels one decode step of a 28-layer model runs (a proxy for a GPU's per-step cost where small kernels
dominate), on this machine: PyTorch's operations on the ordinary passes and at one pass shape run eagerly, and the
kernels of the same shaped pass compiled by torch.compile. Compiled passes are compiled by region (the layers' inputs,
a layer, the head): their fused kernels and products are counted in inductor's output code (on a CPU C++ kernels, on
CUDA Triton ones), a layer's once per layer, with the operations that run eagerly between the regions.

    python benchmarks/pass_kernels.py                  # the CPU, a tiny-width 28-layer model
    python benchmarks/pass_kernels.py --device cuda    # the same on a GPU (what its graphs replay)

Then the same with the fused attention (kernels/triton_attention.py, the default on CUDA) where Triton is installed;
on a CPU its kernel runs in Triton's interpreter. The prefill before the step runs eagerly with the attention written
out (the cache's numbers do not change what a step runs).

Operations that only re-view a tensor (view, permute, expand, a reshape or a conversion that returns its input's
memory) launch nothing and are not counted.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from verispec.kernels import triton_attention  # noqa: E402
from verispec.models.pass_shape import PassShape, use_pass_shape  # noqa: E402
from verispec.testing import tiny_config, tiny_model  # noqa: E402

VIEWS = {"view", "_unsafe_view", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "select", "slice",
         "as_strided", "detach", "alias", "split", "split_with_sizes", "unflatten", "unbind", "lift_fresh",
         "_reshape_alias"}  # fmt: skip
CONTEXT = 300


class Counted(TorchDispatchMode):
    """Counts the operations that run a kernel: those that write in place, or whose result is new memory (a
    conversion to the dtype a tensor has, or a reshape that views, returns its input's memory and runs nothing)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in VIEWS and (name.endswith("_") or not _aliases(out, args, kwargs)):
            self.count += 1
        return out


def _aliases(out, args, kwargs) -> bool:
    """Whether every tensor `out` holds lies in the memory of a tensor among the inputs."""
    inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
    outputs = [t.untyped_storage().data_ptr() for t in _tensors(out)]
    return bool(outputs) and all(ptr in inputs for ptr in outputs)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


class OutputCode(logging.Handler):
    """The output code inductor logs, kept."""

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.endswith("__output_code"):
            self.texts.append(record.getMessage())


def step_model(layers: int, device: str, shape: PassShape | None, compiled: bool = False, fused: bool = False):
    """The model, its cache after CONTEXT tokens and the tokens; the prefill's passes eager and written out (the
    cache's numbers do not change what a step runs, and the interpreter would take minutes), the step's as asked."""
    model = tiny_model(tiny_config(num_layers=layers, hidden_size=128, intermediate_size=256), device=device)
    use_pass_shape(model, shape, graphs=False, fused=False)
    ids = torch.randint(0, 256, (1, CONTEXT + 1), generator=torch.Generator().manual_seed(0)).to(device)
    cache = model.new_cache(num_slots=1, max_len=CONTEXT + 8)
    model(ids[:, :CONTEXT], cache, [0], num_logits=1)
    use_pass_shape(model, shape, graphs=False, compiled=compiled, fused=fused)
    return model, cache, ids


def eager_ops(layers: int, device: str, shape: PassShape | None, fused: bool = False) -> int:
    model, cache, ids = step_model(layers, device, shape, fused=fused)
    model(ids[:, CONTEXT:], cache, [0])  # the step's own lazy initialisations, before counting
    cache.set_length(0, CONTEXT)
    with Counted() as counted:
        model(ids[:, CONTEXT:], cache, [0])
    return counted.count


def outside_regions(layers: int, device: str, shape: PassShape, fused: bool = False) -> int:
    """The operations of an eager shaped step outside the regions compiled passes compile (ShapedPasses._start,
    _layer, _finish): what runs eagerly beside the compiled ones."""
    inside = [0]

    def region(function):
        def counted(*args, **kwargs):
            inside[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                inside[0] -= 1

        return counted

    class Outside(Counted):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if inside[0]:
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

    model, cache, ids = step_model(layers, device, shape, fused=fused)
    model(ids[:, CONTEXT:], cache, [0])
    cache.set_length(0, CONTEXT)
    for runner in model._shaped.values():
        runner._start, runner._layer, runner._finish = (
            region(f) for f in (runner._start, runner._layer, runner._finish)
        )
    with Outside() as counted:
        model(ids[:, CONTEXT:], cache, [0])
    return counted.count


def compiled_kernels(layers: int, device: str, shape: PassShape, fused: bool = False) -> tuple[int, int, int, float]:
    """(fused kernels, products and other library calls, eager operations beside them) one decode step runs with
    compiled passes: the layers' inputs, a layer's region once per layer and the head's, the rest eagerly; and the
    seconds the first pass took (its compilation, no cache of an earlier run used)."""
    torch._dynamo.reset()  # an earlier call's compiled regions (the head's is the same function) compile again
    handler = OutputCode()
    torch._logging.set_logs(output_code=True)  # before the handler: it resets torch's loggers
    logger = logging.getLogger("torch._inductor")  # where its modules' records stop
    logger.addHandler(handler)
    try:
        with torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph is loaded, not written out
            model, cache, ids = step_model(layers, device, shape, compiled=True, fused=fused)
            begin = time.perf_counter()
            model(ids[:, CONTEXT:], cache, [0])
            compiling = time.perf_counter() - begin
    finally:
        torch._logging.set_logs()
        logger.removeHandler(handler)
    modules = [text for text in handler.texts if "def call(" in text]
    if len(modules) != 3:  # the prefill and the step read as many key blocks: each region compiled once
        raise SystemExit(f"expected 3 compiled regions (the layers' inputs, a layer, the head), got {len(modules)}")
    counts = [_kernels(module) for module in modules]
    kernels = counts[0][0] + layers * counts[1][0] + counts[2][0]
    library = counts[0][1] + layers * counts[1][1] + counts[2][1]
    return kernels, library, outside_regions(layers, device, shape, fused=fused), compiling


def _kernels(module: str) -> tuple[int, int]:
    """(fused kernels, library calls) in one of inductor's output modules."""
    body = module.split("def call(", 1)[1]
    body = re.split(r"\n\s*def \w+\(|\ndef \w+\(", body)[0]
    fused = len(re.findall(r"^\s+(?:cpp_fused_\w+\(|triton_\w+\.run\()", body, re.M))
    library = len(re.findall(r"^\s+(?:\w+ = )?(?:extern_kernels\.\w+|torch\.ops(?:\.\w+)+)\(", body, re.M))
    return fused, library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="8x8")
    args = parser.parse_args()
    if not args.device.startswith("cuda"):  # Triton's kernels run in its interpreter, in Python
        triton_attention.use_interpreter()
    groups, width = (int(n) for n in args.shape.split("x"))
    shape = PassShape(groups=groups, width=width)
    print(f"one decode step of a {args.layers}-layer model after {CONTEXT} tokens, on {args.device}:")
    print(f"  ordinary passes, eager: {eager_ops(args.layers, args.device, None)} operations")
    print(f"  pass shape {shape}, eager: {eager_ops(args.layers, args.device, shape)} operations")
    fused, library, eager, compiling = compiled_kernels(args.layers, args.device, shape)
    print(
        f"  pass shape {shape}, compiled: {fused + library + eager} kernels ({fused} fused, {library} products "
        f"and others in the compiled regions, {eager} eager operations beside them); its first pass compiled in "
        f"{compiling:.1f} s"
    )
    if not triton_attention.available():
        print('  (the fused attention needs Triton: pip install -e ".[test]")')
        return
    print(f"  with the fused attention (kernels/triton_attention.py), eager: "
          f"{eager_ops(args.layers, args.device, shape, fused=True)} operations")  # fmt: skip
    fused, library, eager, _ = compiled_kernels(args.layers, args.device, shape, fused=True)
    print(
        f"  with the fused attention, compiled: {fused + library + eager} kernels ({fused} fused, {library} products "
        f"and attention kernels in the compiled regions, {eager} eager operations beside them)"
    )


if __name__ == "__main__":
    main()
