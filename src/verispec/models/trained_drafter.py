"""What the drafters trained for a target (an EAGLE-3 head, a DFlash drafter) share: their matrices moved onto the
native kernels beside a native target, and their checkpoints' tensors checked against the module before loading.

A trained drafter only proposes: the coarser rounding of its Q4_0 form changes which tokens it proposes, never the
output (the target verifies every one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ModelLoadError


def on_the_kernels(linear: nn.Module | None) -> nn.Module | None:
    """`linear` on the native kernels in Q4_0, requantized once (a matrix whose rows do not split into 32-weight blocks
    stays float32); anything that is not an `nn.Linear` is returned as it is. Call `native.claim_threads()` first."""
    from ..kernels import native
    from ..kernels.linear import NativeLinear

    if not isinstance(linear, nn.Linear):
        return linear
    rows = linear.weight.detach().float().contiguous()
    raw = rows.view(torch.uint8).reshape(rows.shape[0], -1)
    if linear.in_features % 32:
        return NativeLinear(linear.in_features, [(0, raw)])
    ids = torch.arange(rows.shape[0])
    return NativeLinear(linear.in_features, [(native.Q4_0, native.requantize_q4_0(0, raw, ids, rows.shape[1]))])


def load_checked(module: nn.Module, state: dict[str, torch.Tensor], where: str, what: str) -> None:
    """Load `state` into `module` (as float32) once every tensor it expects is there with its shape; else one
    ModelLoadError naming `where` and the first tensors missing or misshapen (`what`: the drafter's name)."""
    expected = dict(module.state_dict())
    missing = [name for name in expected if name not in state]
    if missing:
        raise ModelLoadError(f"{where}: {what} lacks {', '.join(missing[:8])}")
    for name, value in state.items():
        if tuple(value.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"{where}: {name} is {list(value.shape)}, not {list(expected[name].shape)}")
    module.load_state_dict({k: v.float() for k, v in state.items()}, assign=True, strict=True)


def read_gguf(path: Path, architecture: str) -> tuple[Any, dict[str, Any]]:
    """A drafter's GGUF file (llama.cpp's converter writes `architecture`): its reader and its fields; else one
    ModelLoadError."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the gguf package raises assorted errors for bad bytes
        raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    fields = {name: field.contents() for name, field in reader.fields.items()}
    if fields.get("general.architecture") != architecture:
        raise ModelLoadError(
            f"{path}: a GGUF of architecture '{fields.get('general.architecture')}', not {architecture}"
        )
    return reader, fields


def gguf_tensor(tensor: Any) -> torch.Tensor:
    """A GGUF tensor as float32 (an I64 one, such as an EAGLE-3 head's d2t, as int64), in PyTorch's shape (rows
    first)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))
    if tensor.tensor_type == GGMLQuantizationType.I64:
        return torch.from_numpy(np.array(tensor.data, dtype=np.int64).reshape(shape))
    values = dequantize(tensor.data, tensor.tensor_type)
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


def gguf_keys(fields: dict[str, Any], architecture: str, where: str) -> Callable[..., Any]:
    """A reader of a drafter's GGUF keys under `architecture.`: `key(name, default=None)`; a key that is absent
    without a default is one ModelLoadError naming it."""

    def key(name: str, default: Any = None) -> Any:
        value = fields.get(f"{architecture}.{name}", default)
        if value is None:
            raise ModelLoadError(f"{where}: GGUF metadata lacks '{architecture}.{name}'")
        return value

    return key
