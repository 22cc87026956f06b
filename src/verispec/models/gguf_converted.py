"""A GGUF file on PyTorch's kernels: converted once (dequantized, or re-packed as int4/int8, q/k/v and gate/up
fused) into a cache folder per weight form, one safetensors shard per part (embedding, head, norm, each layer),
written part by part so that converting never holds the whole model in memory. Later loads memory-map the shards:
start-up takes a fraction of a second and the pages the decode never reads (most of the embedding) are never loaded.
A conversion is written to `<folder>.tmpPID` and renamed into place when complete; temporaries of processes that
died are removed by the next conversion. (The native kernels read the file's own blocks: gguf_native.py.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..errors import ModelLoadError
from .config import ModelConfig
from .converted import converted_folder, writing
from .tokenizer import Tokenizer
from .weights import state_dict_parts


def load_gguf_converted(path: Path, dtype: torch.dtype, progress: bool, quantization: str):
    """(config, state dict, tokenizer) of the GGUF file `path` in PyTorch's weight form `quantization`: converted
    once into a cache folder, memory-mapped after."""
    folder = converted_folder(path, _weight_form(dtype, quantization))
    if not (folder / "config.json").is_file():
        _convert_gguf(path, dtype, folder=folder, progress=progress, quantization=quantization)
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
                source.config, source.fetch, dtype, quantization=quantization, fetch_int4=source.fetch_int4,
                row_count=source.row_count,
            )  # fmt: skip
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


def _weight_form(dtype: torch.dtype, quantization: str) -> str:
    form = str(dtype).removeprefix("torch.")
    if quantization != "none":  # PyTorch's int4 packing differs between CPU capabilities (AVX2, AVX-512)
        form = f"{quantization}-torch{torch.__version__}-{torch.backends.cpu.get_cpu_capability().lower()}"
    return form
