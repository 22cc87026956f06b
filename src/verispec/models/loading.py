"""Load a model and its tokenizer from a bundled name, a GGUF file or a Hugging Face folder.

GGUF files are converted once (dequantized or re-packed, q/k/v and gate/up fused) into a cache folder per
weight format, one safetensors shard per part (embedding, head, norm, each layer), written part by part so
that converting never holds the whole model in memory. Later loads memory-map the shards: start-up takes
a fraction of a second and the pages the decode never reads (most of the embedding) are never loaded.
A conversion is written to `<folder>.tmpPID` and renamed into place when complete; temporaries of
processes that died are removed by the next conversion.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..errors import InvalidParameterError, ModelLoadError
from . import bundled
from .config import ModelConfig
from .converted import converted_folder, writing
from .model import Transformer
from .quantize import ACTIVATION_DTYPE, QUANTIZATIONS, default_draft_quantization, use_quantized_linears
from .tokenizer import Tokenizer
from .weights import assemble_state_dict, state_dict_parts

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

    `quantization`: 'none' (weights in `dtype`), or 'int4' / 'int4-all' / 'int8' weight-only linears with
    bfloat16 activations (CPU; see quantize.py).
    """
    torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
    if quantization not in QUANTIZATIONS:
        raise InvalidParameterError(f"unknown quantization '{quantization}' (choose from {', '.join(QUANTIZATIONS)})")
    if quantization == "gguf" and torch_device.type != "cpu":
        raise InvalidParameterError("gguf quantization runs on the native CPU kernels; use --device cpu")
    if quantization != "none":
        if torch_device.type != "cpu":
            raise InvalidParameterError("int4/int8 quantization runs on the CPU kernels; use --device cpu")
        torch_dtype = ACTIVATION_DTYPE
    text = str(source)
    if bundled.is_bundled_name(text):
        path = bundled.bundled_path(text, progress=progress)
    else:
        path = Path(text).expanduser()
        if not path.exists():
            raise ModelLoadError(f"model path does not exist: {path}")
        if not os.access(path, os.R_OK):
            raise ModelLoadError(f"model path is not readable: {path}")
    if quantization == "gguf":
        from ..kernels import native
        from .gguf_native import FORM, load_native

        loaded = None
        if path.is_file() and native.available():
            loaded = load_native(path, converted_folder(path, FORM), progress)
        if loaded is not None:
            return LoadedModel(text, path, *loaded)
        quantization = "int4"  # not a GGUF file, or block types without a native kernel: PyTorch's kernels
    if path.is_dir():
        config, state, tokenizer = _load_hf_folder(path, torch_dtype, quantization)
    else:
        config, state, tokenizer = _load_gguf_converted(path, torch_dtype, progress, quantization)
    with torch.device("meta"):
        model = Transformer(config)
        if quantization != "none":
            use_quantized_linears(model, state)
    model.load_state_dict(state, assign=True, strict=True)
    return LoadedModel(text, path, model.to(torch_device).eval(), tokenizer)


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
    `draft_quantization` None: quantize.default_draft_quantization of the target's."""
    loaded = target if isinstance(target, LoadedModel) else load_model(target, dtype, device, progress, quantization)
    if draft is None or isinstance(draft, LoadedModel):
        second = draft
    else:
        draft_quantization = draft_quantization or default_draft_quantization(quantization)
        same = not isinstance(target, LoadedModel) and str(draft) == str(target)
        if same and draft_quantization == quantization:
            second = loaded
        else:
            second = load_model(draft, dtype, device, progress, draft_quantization)
    if second is not None:
        loaded.tokenizer.check_compatible(second.tokenizer)
    return loaded, second


def _weight_form(dtype: torch.dtype, quantization: str) -> str:
    form = str(dtype).removeprefix("torch.")
    if quantization != "none":  # PyTorch's int4 packing differs between CPU capabilities (AVX2, AVX-512)
        form = f"{quantization}-torch{torch.__version__}-{torch.backends.cpu.get_cpu_capability().lower()}"
    return form


def _load_gguf_converted(path: Path, dtype: torch.dtype, progress: bool, quantization: str):
    folder = converted_folder(path, _weight_form(dtype, quantization))
    if not (folder / "config.json").is_file():
        _convert_gguf(path, dtype, folder, progress, quantization)
    config = ModelConfig.from_json((folder / "config.json").read_text())
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state |= load_file(shard)  # memory-mapped: pages are read as the model touches them
    state = {name: _aligned(name, tensor) for name, tensor in state.items()}
    return config, state, Tokenizer.load_for_gguf(folder, path)


def _aligned(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A quantized linear's buffers on 64-byte boundaries: a safetensors shard aligns its tensors to 8 bytes only,
    and PyTorch's int8 product reads its weights with aligned 16-byte loads (it crashed on a shard whose header
    length left them 8 bytes off). Other tensors stay memory-mapped where they are."""
    if name.endswith((".qweight", ".qscales")) and tensor.data_ptr() % 64:
        return tensor.clone()
    return tensor


def _convert_gguf(path: Path, dtype: torch.dtype, folder: Path, progress: bool, quantization: str) -> None:
    """Convert part by part into a temporary folder, renamed into place only when complete."""
    from .gguf_source import GGUFSource

    source = GGUFSource(path)
    bar = tqdm(total=source.config.num_layers + 3, desc=f"converting {path.name}", unit="part", disable=not progress)
    try:
        with writing(folder, path) as tmp:
            parts = state_dict_parts(
                source.config, source.fetch, dtype, quantization, source.fetch_int4, source.row_count
            )
            for name, part in parts:
                save_file(part, tmp / f"{name}.safetensors")
                source.release_pages()
                bar.update(1)
            source.write_tokenizer_and_config(tmp)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: GGUF file lacks tensor for {missing}") from None
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    finally:
        bar.close()


def _load_hf_folder(path: Path, dtype: torch.dtype, quantization: str):
    from .hf_source import HFSource

    source = HFSource(path)
    try:
        state = assemble_state_dict(source.config, source.fetch, dtype, quantization=quantization)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: checkpoint lacks the tensor for {missing}") from None
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return source.config, state, Tokenizer.from_transformers(path, extra_stop_ids=source.stop_ids)
