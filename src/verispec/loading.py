"""Load a model and its tokenizer from a bundled name, a GGUF file or a Hugging Face folder.

GGUF files are converted once (dequantized, q/k/v and gate/up fused) into a cache folder per dtype,
so later loads map a safetensors file instead of dequantizing 1.5B weights again (~40 s -> seconds).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from . import bundled
from .config import ModelConfig
from .errors import InvalidParameterError, ModelLoadError
from .model import Transformer
from .quantize import ACTIVATION_DTYPE, QUANTIZATIONS
from .tokenizer import Tokenizer
from .weights import assemble_state_dict

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CONVERTED_FORMAT = 1  # bump when the converted layout changes


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
    if path.is_dir():
        config, state, tokenizer = _load_hf_folder(path, torch_dtype, quantization)
    else:
        config, state, tokenizer = _load_gguf_converted(path, torch_dtype, progress, quantization)
    with torch.device("meta"):
        model = Transformer(config)
        if quantization != "none":
            model.use_quantized_linears(state)
    model.load_state_dict(state, assign=True, strict=True)
    return LoadedModel(text, path, model.to(torch_device).eval(), tokenizer)


def _load_gguf_converted(path: Path, dtype: torch.dtype, progress: bool, quantization: str):
    folder = _converted_folder(path, dtype, quantization)
    if not (folder / "model.safetensors").is_file():
        _convert_gguf(path, dtype, folder, progress, quantization)
    config = ModelConfig.from_json((folder / "config.json").read_text())
    stop_ids = json.loads((folder / "stop_ids.json").read_text())
    return config, load_file(folder / "model.safetensors"), Tokenizer.from_folder(folder, extra_stop_ids=stop_ids)


def _converted_folder(path: Path, dtype: torch.dtype, quantization: str) -> Path:
    stat = path.resolve().stat()
    form = str(dtype).removeprefix("torch.")
    if quantization != "none":  # PyTorch's int4 packing differs between CPU capabilities (AVX2, AVX-512)
        form = f"{quantization}-torch{torch.__version__}-{torch.backends.cpu.get_cpu_capability().lower()}"
    key = f"{path.stem}-{stat.st_size}-{int(stat.st_mtime)}-{form}-v{_CONVERTED_FORMAT}"
    return bundled.cache_dir() / "converted" / key


def _convert_gguf(path: Path, dtype: torch.dtype, folder: Path, progress: bool, quantization: str) -> None:
    from .gguf_source import GGUFSource

    source = GGUFSource(path)
    bar = tqdm(total=source.config.num_layers, desc=f"converting {path.name}", unit="layer", disable=not progress)
    try:
        state = assemble_state_dict(
            source.config, source.fetch, dtype, lambda: bar.update(1), quantization, source.fetch_int4
        )
    except KeyError as missing:
        raise ModelLoadError(f"{path}: GGUF file lacks tensor for {missing}") from None
    finally:
        bar.close()
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(state, tmp / "model.safetensors")
        (tmp / "config.json").write_text(source.config.to_json())
        eot = source.reader.fields.get("tokenizer.ggml.eot_token_id")
        (tmp / "stop_ids.json").write_text(json.dumps([int(eot.contents())] if eot else []))
        Tokenizer.from_folder(path.parent, gguf_file=path.name).save(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_hf_folder(path: Path, dtype: torch.dtype, quantization: str):
    from .hf_source import HFSource

    source = HFSource(path)
    try:
        state = assemble_state_dict(source.config, source.fetch, dtype, quantization=quantization)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: checkpoint lacks the tensor for {missing}") from None
    return source.config, state, Tokenizer.from_folder(path, extra_stop_ids=source.stop_ids)
