"""The models on this machine, described without loading them: each found in a store (stores.py) or bundled, with its
family (families.py), size, quantization, the drafter its checkpoint carries, and, read when asked, its token table.

A GGUF file is read only as far as its header's model keys (the tokenizer's arrays come after them): a description
costs milliseconds whatever the vocabulary. Its token table is read when a drafter is matched against a target
(`ModelInfo.tokens`), and compared as the loader compares tokenizers (`tables_fit`: one table extends the other).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelLoadError
from . import bundled, families, stores
from .family import Family
from .gguf_vocab import read_metadata

TOKENS = "tokenizer.ggml.tokens"


@dataclass
class ModelInfo:
    name: str  # what --model takes to find it again
    path: Path
    where: str  # hf, ollama, lmstudio, bundled, path
    family: Family | None = None  # None: verispec runs no family of it (`problem` says why)
    size: int = 0  # bytes on disk
    quantization: str | None = None
    carries: str | None = None  # the method drafting with what its checkpoint carries (family.drafter), where it does
    problem: str | None = None  # why it cannot be read or run
    _tokens: list[str | None] | None = field(default=None, repr=False)

    @property
    def drafter_only(self) -> bool:
        """A drafter's own checkpoint (an assistant): it drafts for a target of its family and is none itself."""
        return self.family is not None and self.family.load_folder is not None

    def tokens(self) -> list[str | None] | None:
        """Its token table by id (None where it cannot be read)."""
        if self._tokens is None:
            try:
                self._tokens = token_table(self.path)
            except (ModelLoadError, OSError, ValueError, KeyError):
                self._tokens = []
        return self._tokens or None


def describe(path: Path, name: str, where: str) -> ModelInfo:
    """A model file or folder described (a description saying what is wrong where it cannot be read)."""
    info = ModelInfo(name=name, path=path, where=where, size=_size(path))
    try:
        if path.is_dir():
            _describe_folder(info)
        else:
            _describe_gguf(info)
    except (ModelLoadError, OSError, ValueError, KeyError, TypeError) as exc:
        info.problem = str(exc)
    return info


def _describe_gguf(info: ModelInfo) -> None:
    head = read_metadata(info.path, stop=lambda key, found: key.startswith("tokenizer."))
    arch = head.get("general.architecture")
    info.family = families.of_architecture(arch)
    info.quantization = _file_type(head.get("general.file_type")) or stores.quant_of(info.path.name)
    if info.family is None:
        info.problem = f"architecture '{arch}' is not supported"
    elif info.family.drafter and info.family.trailing_blocks_key:  # its trailing blocks: the drafter it carries
        info.carries = info.family.drafter if head.get(f"{arch}.{info.family.trailing_blocks_key}", 0) else None


def _describe_folder(info: ModelInfo) -> None:
    raw = json.loads((info.path / "config.json").read_text())
    info.family = families.of_model_type(raw.get("model_type"))
    dtype = raw.get("torch_dtype") or raw.get("dtype") or (raw.get("text_config") or {}).get("dtype")
    quantized = (raw.get("quantization_config") or {}).get("quant_method")
    info.quantization = quantized or dtype
    if info.family is None:
        info.problem = f"model_type '{raw.get('model_type')}' is not supported"
    elif info.family.drafter and not info.drafter_only:
        _, config = families.config_from_hf(raw, str(info.path))
        info.carries = info.family.drafter if config.mtp_layers else None


def _file_type(value: int | None) -> str | None:
    if value is None:
        return None
    from gguf import LlamaFileType

    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return None


def _size(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def token_table(path: Path) -> list[str | None]:
    """A model's token table by id: a GGUF file's tokens, a checkpoint folder's tokenizer.json (its vocabulary and
    added tokens)."""
    if path.is_file():
        return read_metadata(path, (TOKENS,), stop=lambda key, found: TOKENS in found)[TOKENS]
    data = json.loads((path / "tokenizer.json").read_text())
    ids = dict(data["model"]["vocab"]) if isinstance(data["model"].get("vocab"), dict) else {}
    ids |= {token["content"]: token["id"] for token in data.get("added_tokens", [])}
    return table_of(ids)


def table_of(ids: dict[str, int]) -> list[str | None]:
    """A token -> id mapping as a table by id (None where no token has that id)."""
    table: list[str | None] = [None] * (max(ids.values(), default=-1) + 1)
    for token, i in ids.items():
        table[i] = token
    return table


def tables_fit(one: list[str | None], other: list[str | None]) -> bool:
    """Whether one token table extends the other (Tokenizer.check_compatible's rule: every token of the shorter has
    its id in the longer; padding rows beyond do not matter)."""
    small, large = sorted((one, other), key=len)
    return all(token is None or large[i] == token for i, token in enumerate(small))


def bundled_draft(target_tokens: list[str | None] | None, join: bool = True, progress: bool = True) -> ModelInfo | None:
    """The bundled draft where it may draft for a target of these tokens: installed, its sampled tokens at their ids
    in the target's table, and its whole table fitting where it is joined (`join`: joined first where it is not yet,
    as it is about to be used; else judged by the samples). None where it does not fit or is not installed."""
    model = bundled.DRAFT
    if not target_tokens or not bundled.installed(model):
        return None
    if any(i < len(target_tokens) and target_tokens[i] != token for i, token in model.token_samples):
        return None
    path = bundled.cache_dir() / model.filename
    if not path.is_file() and not join:
        return ModelInfo(name="draft", path=path, where="bundled", size=model.size)
    joined = bundled.bundled_path("draft", progress=progress)
    info = _described(joined, joined.stat().st_mtime_ns)
    return info if info.tokens() and tables_fit(target_tokens, info.tokens()) else None


@functools.lru_cache(maxsize=2)
def _described(path: Path, mtime: int) -> ModelInfo:
    """The bundled draft described once per process (its token table read once), again where the file changed."""
    return describe(path, "draft", "bundled")


def find_models() -> list[ModelInfo]:
    """Every model in the stores (stores.py) and the bundled ones already joined, described; by store, then name."""
    found = []
    for where, entries in (("hf", stores.hub_entries), ("ollama", stores.ollama_entries),
                           ("lmstudio", stores.lmstudio_entries)):  # fmt: skip
        try:
            found += [describe(path, name, where) for name, path in entries()]
        except (ModelLoadError, OSError) as exc:  # a damaged store: the others are still listed
            found.append(ModelInfo(name=f"({where})", path=Path(), where=where, problem=str(exc)))
    for role, model in bundled.BUNDLED.items():
        joined = bundled.cache_dir() / model.filename
        if joined.is_file():
            found.append(describe(joined, role, "bundled"))
    return found
