"""Read a GGUF file: config from its metadata, tensors dequantized by the `gguf` package."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from ..errors import ModelLoadError
from .config import ModelConfig
from .quantize import Int4Weight, int4_from_gguf
from .tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = {"llama", "qwen2", "mistral"}
_LAYER_NAMES = {
    "attn_norm": "attn_norm.weight",
    "q": "attn_q.weight",
    "k": "attn_k.weight",
    "v": "attn_v.weight",
    "q_bias": "attn_q.bias",
    "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias",
    "o": "attn_output.weight",
    "mlp_norm": "ffn_norm.weight",
    "gate": "ffn_gate.weight",
    "up": "ffn_up.weight",
    "down": "ffn_down.weight",
}
_GLOBAL_NAMES = {"embed": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}


class GGUFSource:
    def __init__(self, path: Path):
        try:
            self.reader = GGUFReader(path)
        except Exception as exc:  # the gguf package raises assorted errors for non-GGUF bytes
            raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
        self.path = path
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = str(self._field("general.architecture"))
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"{path}: architecture '{self.arch}' is not supported (supported: "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
            )
        scaling = str(self._field(f"{self.arch}.rope.scaling.type", "none"))
        if "rope_freqs.weight" in self.tensors:  # how llama.cpp's converter stores Llama 3's rope scaling
            scaling = "llama3 (rope_freqs)"
        if scaling != "none":  # the model computes plain rope: it would give other logits, silently
            raise ModelLoadError(f"{path}: rope scaling '{scaling}' is not supported")
        self.config = self._config()

    def _field(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            if default is None:
                raise ModelLoadError(f"{self.path}: GGUF metadata lacks '{key}'")
            return default
        return field.contents()

    def _config(self) -> ModelConfig:
        a = self.arch
        num_heads = int(self._field(f"{a}.attention.head_count"))
        hidden = int(self._field(f"{a}.embedding_length"))
        return ModelConfig(
            vocab_size=int(self.tensors["token_embd.weight"].shape[1]),
            hidden_size=hidden,
            num_layers=int(self._field(f"{a}.block_count")),
            num_heads=num_heads,
            num_kv_heads=int(self._field(f"{a}.attention.head_count_kv", num_heads)),
            intermediate_size=int(self._field(f"{a}.feed_forward_length")),
            rope_theta=float(self._field(f"{a}.rope.freq_base", 10000.0)),
            rms_norm_eps=float(self._field(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            qkv_bias="blk.0.attn_q.bias" in self.tensors,
            tie_word_embeddings="output.weight" not in self.tensors,
            max_position_embeddings=int(self._field(f"{a}.context_length", 4096)),
            head_dim=int(self._field(f"{a}.attention.key_length", hidden // num_heads)),
        )

    def _tensor(self, name: str):
        layer, _, short = name.partition(".")
        return self.tensors.get(f"blk.{layer}.{_LAYER_NAMES[short]}" if short else _GLOBAL_NAMES[name])

    def _rope_heads(self, name: str) -> int | None:
        """Heads whose rows llama.cpp permuted for this tensor (Llama-architecture q and k), else None."""
        short = name.partition(".")[2]
        if self.arch not in {"llama", "mistral"} or short not in {"q", "k", "q_bias", "k_bias"}:
            return None
        return self.config.num_heads if short.startswith("q") else self.config.num_kv_heads

    def write_tokenizer_and_config(self, folder: Path) -> None:
        """The tokenizer (read once, Tokenizer.from_gguf) and, last, config.json: what every cached form holds."""
        eot = self.reader.fields.get("tokenizer.ggml.eot_token_id")
        stop_ids = (int(eot.contents()),) if eot else ()
        Tokenizer.from_gguf(self.path, extra_stop_ids=stop_ids).save(folder)
        (folder / "config.json").write_text(self.config.to_json())

    def release_pages(self) -> None:
        """Drop the file's pages that were read from this process's memory map (they stay in the page cache):
        converting part by part then never holds more of the file in memory than one part."""
        mapped = getattr(self.reader.data, "_mmap", None)  # numpy.memmap keeps its mmap.mmap here
        if mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapped.madvise(mmap.MADV_DONTNEED)

    def row_count(self, name: str) -> int:
        tensor = self._tensor(name)
        return int(tensor.shape[-1]) if tensor is not None and len(tensor.shape) == 2 else 0

    def fetch(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor | None:
        """Dequantized to float32 (rows [start, stop) of a matrix, or all of it)."""
        tensor = self._tensor(name)
        if tensor is None:
            return None
        shape = tuple(int(d) for d in reversed(tensor.shape))
        data = tensor.data
        if rows is not None:
            data, shape = data[rows[0] : rows[1]], (rows[1] - rows[0], *shape[1:])
        array = dequantize(data, tensor.tensor_type)
        array = array.reshape(shape or array.shape)
        weight = torch.from_numpy(np.array(array, dtype=np.float32))  # a writable copy
        heads = self._rope_heads(name)
        if heads is not None and rows is not None:
            raise ValueError(f"{name}: rotary rows are permuted per head; fetch the whole matrix")
        return weight if heads is None else undo_rope_permutation(weight, heads)

    def fetch_int4(self, name: str, rows: tuple[int, int] | None = None) -> Int4Weight | None:
        """The exact int4 form of a 4-bit tensor (Q4_K, Q4_0, Q4_1), else None (rows as in `fetch`)."""
        tensor = self._tensor(name)
        if tensor is None or len(tensor.shape) != 2:
            return None
        cols, count = (int(d) for d in tensor.shape)
        data = tensor.data if rows is None else tensor.data[rows[0] : rows[1]]
        count = count if rows is None else rows[1] - rows[0]
        weight = int4_from_gguf(np.asarray(data), tensor.tensor_type, count, cols)
        heads = self._rope_heads(name)
        if weight is None or heads is None:
            return weight
        return Int4Weight(*(undo_rope_permutation(t, heads) for t in (weight.q, weight.scale, weight.zero)))


def undo_rope_permutation(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves each head's rotary halves for Llama; restore HF's layout."""
    rest = weight.shape[1:]
    return weight.reshape(heads, weight.shape[0] // heads // 2, 2, *rest).transpose(1, 2).reshape(weight.shape)
