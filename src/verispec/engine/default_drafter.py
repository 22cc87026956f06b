"""The drafter a target gets when none is named: the one rule of `generate`, `serve`, `bench` and the Python API
(`--speculative-model` not given, or `auto`; `SpeculativeGenerator(draft="auto")`, its default).

The first that fits, in this order:
  1. the bundled draft, where its token table is the target's (models/catalog.py: bundled_draft);
  2. the drafter the target's checkpoint carries (its family's `drafter`: Qwen3.5's MTP layer), where it carries one;
  3. a drafter's own checkpoint made for the target's family (a Gemma 4 assistant) among the user's models;
  4. the smallest model of the target's family among the user's models (models/stores.py: the Hugging Face cache,
     Ollama, LM Studio) at most half the target's size whose token table fits the target's;
  5. no draft model: the default method's lookups alone (suffix).
A candidate model's token table is the target's (catalog.tables_fit); it is judged as loaded by its method's own
checks, and one refused gives way to the next. One line (`Drafter.line`) says what was chosen and why; it is logged,
and `generate` prints it. A method named (`--speculative-method`) keeps the candidates it can draft with; one that
needs a draft model and finds none is refused in one line. A draft model named explicitly is not chosen but checked:
one of another vocabulary drafts through text where its method takes one (engine/cross_vocab.py), else is refused in
one line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..defaults import DEFAULT_DRAFTER
from ..errors import InvalidParameterError, ModelLoadError, TokenizerMismatchError
from ..models import catalog, names
from ..models.catalog import ModelInfo
from ..models.loading import LoadedModel
from .methods import DEFAULT_METHOD, Method, get_method, load_models, resolve_method

log = logging.getLogger("verispec")

__all__ = ["DEFAULT_DRAFTER", "Drafter", "Loaded", "candidates", "fitting", "load_with_drafter"]
LARGEST_SHARE = 0.5  # a draft model found among the user's models is at most this share of the target's bytes


@dataclass(frozen=True)
class Drafter:
    """What drafts: a method (None: plain decoding) and the draft model or checkpoint it reads (None: none)."""

    method: str | None
    model: str | None = None  # a source the loader reads (a path, a bundled name), or None
    label: str = ""  # how the line names the model
    why: str = ""

    @property
    def line(self) -> str:
        if self.method is None:
            return f"drafter: none, plain decoding ({self.why})"
        model = f" with {self.label or self.model}" if self.model else ""
        return f"drafter: {self.method}{model} ({self.why})"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "model": self.label or self.model, "why": self.why}


@dataclass
class Loaded:
    """The models loaded for a target and its drafter."""

    method: Method | None
    target: LoadedModel
    draft: Any  # a draft model (LoadedModel), a method's own checkpoint, or None
    drafter: Drafter


def load_with_drafter(
    method_name: str | None, target: Any, draft: Any, *, revision: str | None = None,
    found: Callable[[], list[ModelInfo]] | None = None, **loading,
) -> Loaded:  # fmt: skip
    """The target and its drafter: `draft` as given (a source, a loaded model, or None: none), or, DEFAULT_DRAFTER,
    the one this module chooses (`found`: the user's models, catalog.find_models by default). A source is a path or
    a name (models/names.py; `revision`: the target's, on the Hugging Face hub). `loading`: the loader's arguments
    (models/loading.py: load_pair)."""
    if isinstance(target, (str, os.PathLike)):
        target = names.resolve(str(target), revision, loading.get("progress", True))
    if not (isinstance(draft, str) and draft == DEFAULT_DRAFTER):
        method = resolve_method(method_name, draft is not None)
        draft = draft if method is not None and method.uses_draft_model else None
        loaded_target, loaded_draft = load_models(method, target, draft, **loading)
        label = getattr(loaded_draft, "name", None) or (str(draft) if draft is not None else None)
        drafter = Drafter(method.name if method else None, label, label or "", "given" if draft else "no draft model")
        log.info("%s", drafter.line)
        return Loaded(method, loaded_target, loaded_draft, drafter)
    method = get_method(method_name) if method_name is not None else None
    loaded_target, _ = load_models(None, target, None, **loading)
    rejected: list[str] = []
    for drafter in candidates(describe_loaded(loaded_target), method, found or catalog.find_models):
        chosen = get_method(drafter.method)
        try:
            loaded_draft = _load_draft(chosen, loaded_target, drafter, loading)
            chosen.check(loaded_target, loaded_draft)
        except (InvalidParameterError, TokenizerMismatchError, ModelLoadError) as exc:
            rejected.append(f"{drafter.label or drafter.method}: {exc}")
            continue
        if rejected:
            drafter = Drafter(drafter.method, drafter.model, drafter.label, f"{drafter.why}; passed over: "
                              + "; ".join(rejected))  # fmt: skip
        log.info("%s", drafter.line)
        return Loaded(chosen, loaded_target, loaded_draft, drafter)
    raise InvalidParameterError(
        f"the {method.name} speculative method needs a draft model and none found fits {loaded_target.name} "
        f"({'; '.join(rejected) or 'none of the target family with its vocabulary'}); give one with --speculative-model"
    )


def _load_draft(method: Method, target: LoadedModel, drafter: Drafter, loading: dict) -> Any:
    if drafter.model is None:
        return None
    return load_models(method, target, drafter.model, **loading)[1]


def describe_loaded(target: LoadedModel) -> ModelInfo:
    """A loaded target described as the catalog describes a file, its token table its tokenizer's."""
    path = target.path
    info = catalog.describe(path, target.name, "path") if path.exists() else ModelInfo(target.name, path, "memory")
    if target.tokenizer is not None:
        info._tokens = catalog.table_of(target.tokenizer.vocab)
    return info


def candidates(
    target: ModelInfo, method: Method | None, found: Callable[[], list[ModelInfo]], join: bool = True
) -> Iterator[Drafter]:
    """The drafters that fit `target`, best first (module docstring); for a named `method`, those it drafts with.
    The user's models are read (`found`) only when the first two give none; `join`: the bundled draft is joined to
    compare its whole token table (else judged by its samples: catalog.bundled_draft)."""
    takes_model = method is None or (method.uses_draft_model and method.load_draft is None)
    bundled = catalog.bundled_draft(target.tokens(), join=join) if takes_model else None
    if bundled is not None and not _same(bundled, target):
        yield Drafter(_name(method), "draft", "the bundled draft", "the bundled draft's vocabulary is the target's")
    if method is not None and not method.uses_draft_model:
        yield Drafter(method.name, why="named; it uses no draft model")
        return
    if method is None and target.carries is not None:
        yield Drafter(target.carries, why=f"the target's own: {get_method(target.carries).summary}")
    yield from _found(target, method, found(), takes_model)
    if method is None or not method.needs_draft_model:
        yield Drafter(_name(method), why=f"{_name(method)} lookups alone: {_no_model(target)}")


def _found(target: ModelInfo, method: Method | None, found: list[ModelInfo], takes_model: bool) -> Iterator[Drafter]:
    """The drafters among the user's models (the bundled draft is the first candidate's): assistants of the target's
    family, then smaller models of its family with its vocabulary, smallest first."""
    if target.family is None:
        return
    same = sorted((m for m in found if m.family is not None and m.family.name == target.family.name
                   and m.where != "bundled" and not _same(m, target) and m.problem is None),
                  key=lambda m: m.size)  # fmt: skip
    for model in (m for m in same if m.drafter_only):
        if method is None or method.name == model.family.drafter:
            yield Drafter(model.family.drafter, str(model.path), model.name,
                          f"{model.name} ({model.where}) drafts for the target's family")  # fmt: skip
    if not takes_model:
        return
    for model in (m for m in same if not m.drafter_only and m.size <= LARGEST_SHARE * target.size):
        target_tokens, tokens = target.tokens(), model.tokens()
        if target_tokens and tokens and catalog.tables_fit(target_tokens, tokens):
            yield Drafter(_name(method), str(model.path), model.name,
                          f"{model.name} ({model.where}): the smallest {target.family.name} model found with the "
                          "target's vocabulary")  # fmt: skip


def _same(one: ModelInfo, other: ModelInfo) -> bool:
    """Whether two descriptions are of one file (a name and a path, a link and its blob)."""
    return os.path.realpath(one.path) == os.path.realpath(other.path)


def _name(method: Method | None) -> str:
    return DEFAULT_METHOD if method is None else method.name


def _no_model(target: ModelInfo) -> str:
    family = target.family.name if target.family is not None else "its"
    return (
        f"the bundled draft's vocabulary is not the target's, and no smaller {family} model with the target's "
        "vocabulary is among your models (`verispec models` lists them)"
    )


def fitting(target: ModelInfo, found: list[ModelInfo]) -> list[Drafter]:
    """The drafters that fit `target` as `verispec models` lists them (the first is the default), judged without
    loading: by families, sizes and token tables."""
    if target.family is None or target.drafter_only:
        return []
    return list(candidates(target, None, lambda: found, join=False))
