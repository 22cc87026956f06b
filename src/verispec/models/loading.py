"""Load a model and its tokenizer from a bundled name, a GGUF file or a Hugging Face folder: one path per source.

GGUF file, form gguf      the native kernels on the file's own blocks (gguf_native.py); a block type without a
                          kernel: PyTorch's int4 form instead (or the weights as stored, where the family says so)
GGUF file, form q4_0      the same, the layers' wider matrices requantized to Q4_0 once, cached (a drafter's form)
Hugging Face folder, q4_0 read in float32, then onto the native kernels, the same matrices requantized to Q4_0
GGUF file, other forms    converted once into PyTorch's weights, cached (gguf_converted.py)
Hugging Face folder       read into PyTorch's weights (hf_source.py)
a folder its family loads its own way (a drafter's own checkpoint): its family's loader, on PyTorch as stored

Which family a file is of, and what that family does otherwise: families.py. Nothing here depends on the family or
on the way of drafting a model serves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InvalidParameterError, ModelLoadError
from . import draft_forms, families, names
from .converted import converted_folder
from .gguf_converted import load_gguf_converted
from .hf_source import load_hf_folder, read_config
from .model import Transformer
from .quantize import ACTIVATION_DTYPE
from .tokenizer import Tokenizer
from .weight_forms import COARSE_DRAFT, DRAFT_QUANTIZATIONS
from .weights import assembled_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    name: str
    path: Path
    model: Transformer
    tokenizer: Tokenizer


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise InvalidParameterError(f"unknown dtype '{dtype}' (choose from {', '.join(DTYPES)})")
    return DTYPES[dtype]


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise InvalidParameterError(f"unknown device '{device}' (use cpu, cuda, cuda:N or auto)") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise InvalidParameterError("device 'cuda' requested but no CUDA GPU is available")
    return resolved


def load_model(
    source: str | os.PathLike = "target",
    dtype: str | torch.dtype = "float32",
    device: str | None = "cpu",
    progress: bool = True,
    quantization: str = "none",
) -> LoadedModel:
    """`source`: a bundled model's name (bundled.py), a .gguf file, a Hugging Face checkpoint folder, or a name the
    stores hold (names.py: a Hugging Face repo id, an Ollama name, an LM Studio model key).

    `quantization`: 'none' (weights in `dtype`), 'gguf' (the file's blocks on the native kernels), 'q4_0' (as
    gguf, the layers' matrices stored wider than Q4_0 requantized to it: a drafter's form), or 'int4' / 'int4-all' /
    'int8' weight-only linears with bfloat16 activations (CPU; see quantize.py).
    """
    torch_dtype, torch_device = _checked_form(dtype, device, quantization)
    text = str(source)
    path = names.locate(text, progress=progress)
    family = families.loaded_its_own_way(path)
    if family is not None:  # read as stored, whatever the form asked for
        module, tokenizer = family.load_folder(path, read_config(path), resolve_dtype(dtype), family)
        return LoadedModel(text, path, module.to(torch_device), tokenizer)
    if quantization == COARSE_DRAFT and path.is_dir() and _native_available():
        from .gguf_native import native_from_dense

        dense = load_model(path, "float32", progress=progress)
        return LoadedModel(text, path, native_from_dense(dense.model, coarsen=True), dense.tokenizer)
    if quantization in ("gguf", COARSE_DRAFT):
        native = _native(path, progress, coarsen=quantization == COARSE_DRAFT)
        if native is not None:
            model, tokenizer = native
            return LoadedModel(text, path, model, tokenizer)
        # not a GGUF file, or block types without a native kernel: PyTorch's kernels, in int4 or, where the family
        # says so, the weights as stored, dequantized
        quantization = "none" if _dequantized(path) else "int4"
        torch_dtype = resolve_dtype(dtype) if quantization == "none" else torch_dtype
    if path.is_dir():
        config, state, tokenizer = load_hf_folder(families.open_folder(path), torch_dtype, quantization)
    else:
        config, state, tokenizer = load_gguf_converted(path, torch_dtype, progress, quantization)
    model = assembled_model(config, state, quantization)
    return LoadedModel(text, path, model.to(torch_device).eval(), tokenizer)


def _checked_form(dtype: str | torch.dtype, device: str | None, quantization: str) -> tuple[torch.dtype, torch.device]:
    """The dtype and device a model is loaded in (a quantized one computes in ACTIVATION_DTYPE, on the CPU)."""
    torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
    if quantization not in DRAFT_QUANTIZATIONS:
        choices = ", ".join(DRAFT_QUANTIZATIONS)
        raise InvalidParameterError(f"unknown quantization '{quantization}' (choose from {choices}; q4_0: drafts only)")
    if quantization in ("gguf", COARSE_DRAFT) and torch_device.type != "cpu":
        raise InvalidParameterError(f"{quantization} quantization runs on the native CPU kernels; use --device cpu")
    if quantization != "none":
        if torch_device.type != "cpu":
            raise InvalidParameterError("int4/int8 quantization runs on the CPU kernels; use --device cpu")
        torch_dtype = ACTIVATION_DTYPE
    return torch_dtype, torch_device


def _dequantized(path: Path) -> bool:
    """Whether a GGUF file the native kernels do not run is read with its weights dequantized rather than requantized
    to int4 (whose text would be another model's): where its family says so (family.py: dequantized_fallback)."""
    if not path.is_file():
        return False
    from .gguf_source import GGUFSource

    try:
        family = families.of_architecture(GGUFSource.architecture(path))
    except ModelLoadError:
        return False  # the loader that follows says what is wrong with the file
    return family is not None and family.dequantized_fallback


def _native_available() -> bool:
    from ..kernels import native

    return native.available()


def _native(path: Path, progress: bool, coarsen: bool = False):
    """The model and tokenizer on the native kernels, or None (not a GGUF file, no compiled kernels, or a block type
    without one). `coarsen`: its wider matrices requantized to Q4_0 (a separate cached form)."""
    if not (path.is_file() and _native_available()):
        return None
    from .gguf_native import FORM, load_native

    form = f"{COARSE_DRAFT}-{FORM}" if coarsen else FORM
    return load_native(path, converted_folder(path, form), progress, coarsen=coarsen)


def load_pair(
    target: str | os.PathLike | LoadedModel,
    drafter: str | os.PathLike | LoadedModel | None,
    dtype: str | torch.dtype = "float32",
    device: str | None = "cpu",
    progress: bool = True,
    quantization: str = "none",
    draft_quantization: str | None = None,
) -> tuple[LoadedModel, LoadedModel | None]:
    """A target and the model that drafts for it (None: none), each a source to load or a model already loaded. One
    copy of the weights serves both when they name the same source in the same format. Whether the drafter's
    tokenizer must be the target's is its method's check (engine/methods.py), not the loader's.
    `draft_quantization` None: default_draft_quantization of the target's; 'auto': the drafter's fastest form here
    (draft_forms.py)."""
    if quantization == COARSE_DRAFT:  # the target's numbers are the output: never coarsened
        raise InvalidParameterError(f"{COARSE_DRAFT} is a form for drafts (draft_quantization), not targets")
    draft_form = draft_quantization or default_draft_quantization(quantization)
    if draft_form == "auto":
        # nothing to measure: no drafter, one already loaded, or one its family reads as stored
        as_stored = drafter is None or isinstance(drafter, LoadedModel) or families.loaded_its_own_way(drafter)
        draft_form = "gguf" if as_stored else choose_draft_form(str(drafter), progress)
    wanted = [(target, quantization), (drafter, draft_form)]
    loaded: dict[tuple[str, str], LoadedModel] = {}  # one copy of the weights per source and form
    models: list[LoadedModel | None] = []
    for source, form in wanted:
        if source is None or isinstance(source, LoadedModel):
            models.append(source)
            continue
        key = (str(source), form)
        if key not in loaded:
            loaded[key] = load_model(source, dtype, device=device, progress=progress, quantization=form)
        models.append(loaded[key])
    first, second = models
    if first.tokenizer is None:  # a drafter's own checkpoint, without a tokenizer, given as the target
        family = families.loaded_its_own_way(first.path)
        raise InvalidParameterError(f"{first.name} {family.not_a_target if family else 'has no tokenizer'}")
    if second is not None and second.tokenizer is None:  # a drafter without tokenizer files: its target's ids
        second.tokenizer = first.tokenizer
    return first, second


def choose_draft_form(drafter: str, progress: bool = True) -> str:
    """The drafter's fastest form on this machine (draft_forms.py), measured on models loaded here."""

    def load(source: str, form: str) -> Transformer:
        return load_model(source, "float32", progress=progress, quantization=form).model

    return draft_forms.choose(drafter, load, progress)


def default_draft_quantization(target: str) -> str:
    """A drafter is quantized at least as hard as its target: it runs k times per target pass, and its weights need
    not be exact (the target verifies). The bundled drafter is 8-bit, so int4 would keep it int8; on the native
    kernels its form is measured (auto: as stored, or its layers requantized to Q4_0, draft_forms.py)."""
    if target == "gguf":
        return "auto"
    return "int4-all" if target in ("int4", "int4-all") else target
