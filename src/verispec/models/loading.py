"""Load a model and its tokenizer from a bundled name, a GGUF file or a Hugging Face folder: one path per source.

GGUF file, form gguf      the native kernels on the file's own blocks (gguf_native.py); a block type without a
                          kernel: PyTorch's int4 form instead
GGUF file, form q4_0      the same, the layers' wider matrices requantized to Q4_0 once, cached (a draft's form)
Hugging Face folder, q4_0 read in float32, then onto the native kernels, the same matrices requantized to Q4_0
GGUF file, other forms    converted once into PyTorch's weights, cached (gguf_converted.py)
Hugging Face folder       read into PyTorch's weights (hf_source.py)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InvalidParameterError, ModelLoadError
from . import bundled, draft_forms
from .converted import converted_folder
from .gguf_converted import load_gguf_converted
from .hf_source import load_assistant_folder, load_hf_folder, read_config
from .model import Transformer
from .mtp import transformer
from .quantize import ACTIVATION_DTYPE, use_quantized_linears
from .tokenizer import Tokenizer
from .weight_forms import COARSE_DRAFT, DRAFT_QUANTIZATIONS

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
    """`source`: 'target' / 'draft' (the bundled pair), a .gguf file, or a Hugging Face checkpoint folder.

    `quantization`: 'none' (weights in `dtype`), 'gguf' (the file's blocks on the native kernels), 'q4_0' (as
    gguf, the layers' matrices stored wider than Q4_0 requantized to it: a draft's form), or 'int4' / 'int4-all' /
    'int8' weight-only linears with bfloat16 activations (CPU; see quantize.py).
    """
    torch_dtype, torch_device = _checked_form(dtype, device, quantization)
    text = str(source)
    path = bundled.locate(text, progress)
    if path.is_dir() and read_config(path).get("model_type") == "gemma4_assistant":  # a drafter, on PyTorch
        assistant, tokenizer = load_assistant_folder(path, read_config(path), resolve_dtype(dtype))
        return LoadedModel(text, path, assistant.to(torch_device), tokenizer)
    if quantization == COARSE_DRAFT and path.is_dir() and _native_available():
        from .gguf_native import native_from_dense

        dense = load_model(path, "float32", progress=progress)
        return LoadedModel(text, path, native_from_dense(dense.model, coarsen=True), dense.tokenizer)
    if quantization in ("gguf", COARSE_DRAFT):
        native = _native(path, progress, coarsen=quantization == COARSE_DRAFT)
        if native is not None:
            model, tokenizer = native
            return LoadedModel(text, path, model, tokenizer)
        # not a GGUF file, or block types without a native kernel: PyTorch's kernels; a hybrid model's weights as
        # stored, dequantized
        quantization = "none" if _dequantized(path) else "int4"
        torch_dtype = resolve_dtype(dtype) if quantization == "none" else torch_dtype
    if path.is_dir():
        config, state, tokenizer = load_hf_folder(path, torch_dtype, quantization)
    else:
        config, state, tokenizer = load_gguf_converted(path, torch_dtype, progress, quantization)
    with torch.device("meta"):
        model = transformer(config)
        if quantization != "none":
            use_quantized_linears(model, state)
    model.load_state_dict(state, assign=True, strict=True)
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


def _assistant_folder(source: str | os.PathLike) -> bool:
    """Whether `source` is a Gemma 4 assistant's folder (a drafter read on PyTorch as stored: no form to choose)."""
    path = Path(source).expanduser()
    return (
        path.is_dir() and (path / "config.json").is_file() and read_config(path).get("model_type") == "gemma4_assistant"
    )


def _dequantized(path: Path) -> bool:
    """Whether a GGUF file the native kernels do not run is read with its weights dequantized rather than requantized
    to int4 (whose text would be another model's): Qwen3.5's (linear attention), gpt-oss's and Gemma 4's files."""
    if not path.is_file():
        return False
    from .gguf_config import HYBRID
    from .gguf_source import GGUFSource

    try:
        return GGUFSource.architecture(path) in HYBRID | {"gpt-oss", "gemma4"}  # gemma4: without the native library
    except ModelLoadError:
        return False  # the loader that follows says what is wrong with the file


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
    draft: str | os.PathLike | LoadedModel | None,
    dtype: str | torch.dtype = "float32",
    device: str | None = "cpu",
    progress: bool = True,
    quantization: str = "none",
    draft_quantization: str | None = None,
) -> tuple[LoadedModel, LoadedModel | None]:
    """A target and its draft (None: no draft), each a source to load or a model already loaded. One copy of
    the weights serves both when they name the same source in the same format; the tokenizers must match.
    `draft_quantization` None: default_draft_quantization of the target's; 'auto': the draft's fastest form here
    (draft_forms.py)."""
    if quantization == COARSE_DRAFT:  # the target's numbers are the output: never coarsened
        raise InvalidParameterError(f"{COARSE_DRAFT} is a form for drafts (draft_quantization), not targets")
    draft_form = draft_quantization or default_draft_quantization(quantization)
    if draft_form == "auto":
        given = draft is None or isinstance(draft, LoadedModel) or _assistant_folder(draft)  # nothing to measure
        draft_form = "gguf" if given else choose_draft_form(str(draft), progress)
    wanted = [(target, quantization), (draft, draft_form)]
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
    if first.tokenizer is None:  # a Gemma 4 assistant given as the target
        raise InvalidParameterError(
            f"{first.name} is a Gemma 4 assistant, a drafter: give it as the speculative model of its Gemma 4 target "
            "with --speculative-method assistant"
        )
    if second is not None and second.tokenizer is None:  # an assistant without tokenizer files: its target's ids
        second.tokenizer = first.tokenizer
    if second is not None:
        first.tokenizer.check_compatible(second.tokenizer)
    return first, second


def choose_draft_form(draft: str, progress: bool = True) -> str:
    """The draft's fastest form on this machine (draft_forms.py), measured on models loaded here."""

    def load(source: str, form: str) -> Transformer:
        return load_model(source, "float32", progress=progress, quantization=form).model

    return draft_forms.choose(draft, load, progress)


def default_draft_quantization(target: str) -> str:
    """A draft is quantized at least as hard as its target: it runs k times per target pass, and its
    weights need not be exact (the target verifies). The bundled draft is 8-bit, so int4 would keep it int8; on the
    native kernels its form is measured (auto: as stored, or its layers requantized to Q4_0, draft_forms.py)."""
    if target == "gguf":
        return "auto"
    return "int4-all" if target in ("int4", "int4-all") else target
