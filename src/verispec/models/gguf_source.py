"""Read a GGUF file: config from its metadata, tensors dequantized by the `gguf` package."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError
from . import families
from .gguf_config import config_from_gguf
from .quantize import Int4Weight, int4_from_gguf
from .tokenizer import Tokenizer
from .weights import canonical_names, undo_rope_permutation

_LAYER_NAMES = {
    "attn_norm": "attn_norm.weight",
    "q": "attn_q.weight",
    "k": "attn_k.weight",
    "v": "attn_v.weight",
    "q_bias": "attn_q.bias",
    "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias",
    "o": "attn_output.weight",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "mlp_norm": "ffn_norm.weight",
    "gate": "ffn_gate.weight",
    "up": "ffn_up.weight",
    "down": "ffn_down.weight",
    "post_mlp_norm": "post_ffw_norm.weight",
}
_GLOBAL_NAMES = {"embed": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}
# the MTP block's own tensors (the block after the model's layers)
_MTP_NAMES = {"mtp.fc": "nextn.eh_proj.weight", "mtp.enorm": "nextn.enorm.weight", "mtp.hnorm": "nextn.hnorm.weight",
              "mtp.norm": "nextn.shared_head_norm.weight"}  # fmt: skip


class GGUFSource:
    """A GGUF file's config (gguf_config.py) and tensors by canonical name (weights.py), by its family's rules
    (family.py): a Llama's names, unless the family's entry names them otherwise. Fused tensors (Phi-3's attn_qkv,
    and its ffn_up holding gate then up) are served as the row ranges of their parts. Every tensor of
    the file is read (rope_freqs into the config): one the loader would leave unread means a computation verispec
    does not do, and the file is refused naming it."""

    def __init__(self, path: Path):
        try:
            from gguf import GGUFReader  # here: the gguf package imports yaml, 80 ms a start that reads no GGUF

            self.reader = GGUFReader(path)
        except Exception as exc:  # the gguf package raises assorted errors for non-GGUF bytes
            raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
        self.path = path
        self.tensors = {t.name: t for t in self.reader.tensors}
        shapes = {name: tuple(int(d) for d in t.shape) for name, t in self.tensors.items()}
        self.arch, self.family = families.of_gguf(self.reader.fields, str(path))
        self.config = config_from_gguf(self.reader.fields, shapes, self._floats, where=str(path), family=self.family)
        self.fused = "blk.0.attn_qkv.weight" in self.tensors and self.family.attn_qkv_fused
        self._check_every_tensor_is_read()

    @staticmethod
    def architecture(path: Path) -> str | None:
        """A GGUF file's `general.architecture`, read without its config (ModelLoadError: not a GGUF file)."""
        try:
            from gguf import GGUFReader

            field = GGUFReader(path).fields.get("general.architecture")
        except Exception as exc:  # the gguf package raises assorted errors for non-GGUF bytes
            raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
        return None if field is None else str(field.contents())

    def _floats(self, name: str) -> list[float]:
        tensor = self.tensors[name]
        from gguf.quants import dequantize

        return [float(v) for v in dequantize(tensor.data, tensor.tensor_type).reshape(-1)]

    def _where(self, name: str) -> tuple[str, tuple[int, int] | None]:
        """The tensor of a canonical name, and the rows of it that hold it (None: all)."""
        c, family = self.config, self.family
        if name in _MTP_NAMES:
            return f"blk.{c.num_layers}.{_MTP_NAMES[name]}", None
        layer, _, short = name.partition(".")
        if not short:
            return (_GLOBAL_NAMES | family.gguf_globals)[name], None
        if layer == "mtp":  # "mtp.0.q": the MTP block's decoder layer
            layer, _, short = short.partition(".")
            layer = str(c.num_layers + int(layer))
        base = f"blk.{layer}."
        if short in family.gguf_names:
            return base + family.gguf_names[short], None
        own = family.gguf_where(c, base, short) if family.gguf_where is not None else None
        if own is not None:
            return own
        if self.fused and short in ("q", "k", "v"):
            q, kv = c.num_heads * c.head_size, c.num_kv_heads * c.head_size
            return base + "attn_qkv.weight", {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}[short]
        if family.fused_gate_up and short in ("gate", "up"):
            inter = c.intermediate_size
            return base + "ffn_up.weight", (0, inter) if short == "gate" else (inter, 2 * inter)
        if short == "router":
            return base + "ffn_gate_inp.weight", None
        if short.startswith("expert"):  # expert{e}.gate: rows e * rows .. of the 3-D tensor ffn_gate_exps
            expert, _, kind = short.partition(".")
            e, rows = (
                int(expert.removeprefix("expert")),
                c.hidden_size if kind == "down" else c.expert_intermediate_size,
            )
            return f"{base}ffn_{kind}_exps.weight", (e * rows, (e + 1) * rows)
        return base + _LAYER_NAMES[short], None

    def _check_every_tensor_is_read(self) -> None:
        read = {self._where(name)[0] for name in canonical_names(self.config)} | {"rope_freqs.weight"}
        for name in self.tensors:
            if name not in read:
                raise ModelLoadError(
                    f"{self.path}: GGUF tensor '{name}' is not read by verispec's loader ({self.arch}): it belongs to "
                    "a computation verispec does not do; refused rather than ignored (docs/models.md)"
                )

    def _tensor(self, name: str):
        key, part = self._where(name)
        return self.tensors.get(key), part

    def _rope_heads(self, name: str) -> int | None:
        """Heads whose rows llama.cpp's converter permuted for this tensor (q and k, for the families it permutes),
        else None."""
        short = name.partition(".")[2]
        if not self.family.rope_permuted or short not in {"q", "k", "q_bias", "k_bias"}:
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
        tensor, part = self._tensor(name)  # an expert's matrix is a part of its 3-D tensor
        if part is not None:
            return part[1] - part[0]
        return int(tensor.shape[-1]) if tensor is not None and len(tensor.shape) == 2 else 0

    def fetch(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor | None:
        """Dequantized to float32 (rows [start, stop) of a matrix, or all of it)."""
        tensor, part = self._tensor(name)
        if tensor is None:
            return None
        shape = tuple(int(d) for d in reversed(tensor.shape))
        data = tensor.data
        if len(shape) == 3:  # experts: [experts, rows, columns] read as [experts x rows, columns]
            shape, data = (shape[0] * shape[1], shape[2]), data.reshape(shape[0] * shape[1], -1)
        rows = _within(part, rows)
        if rows is not None:
            data, shape = data[rows[0] : rows[1]], (rows[1] - rows[0], *shape[1:])
        from gguf.quants import dequantize

        array = dequantize(data, tensor.tensor_type)
        array = array.reshape(shape or array.shape)
        weight = torch.from_numpy(np.array(array, dtype=np.float32))  # a writable copy
        if self.family.gguf_fetch is not None:  # a tensor the family's converter stores its own way
            weight = self.family.gguf_fetch(name, weight)
        heads = self._rope_heads(name)
        if heads is not None and rows is not None:
            raise ValueError(f"{name}: rotary rows are permuted per head; fetch the whole matrix")
        return weight if heads is None else undo_rope_permutation(weight, heads)

    def fetch_int4(self, name: str, rows: tuple[int, int] | None = None) -> Int4Weight | None:
        """The exact int4 form of a 4-bit tensor (Q4_K, Q4_0, Q4_1), else None (rows as in `fetch`; and for a family
        whose tensors `fetch` may transform)."""
        tensor, part = self._tensor(name)
        if not self.family.int4_as_stored or tensor is None or len(tensor.shape) != 2:
            return None
        rows = _within(part, rows)
        cols, count = (int(d) for d in tensor.shape)
        data = tensor.data if rows is None else tensor.data[rows[0] : rows[1]]
        count = count if rows is None else rows[1] - rows[0]
        weight = int4_from_gguf(np.asarray(data), tensor.tensor_type, count, cols)
        heads = self._rope_heads(name)
        if weight is None or heads is None:
            return weight
        return Int4Weight(*(undo_rope_permutation(t, heads) for t in (weight.q, weight.scale, weight.zero)))


def _within(part: tuple[int, int] | None, rows: tuple[int, int] | None) -> tuple[int, int] | None:
    """Rows [start, stop) of a part that is itself rows `part` of its tensor, as rows of the tensor."""
    if part is None:
        return rows
    return part if rows is None else (part[0] + rows[0], part[0] + rows[1])
