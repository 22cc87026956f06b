"""Peers in the same run: llama.cpp, through llama-cpp-python, on the same GGUF files.

    llamacpp-plain   Llama.generate(temp=0)                                  its plain greedy decoding
    llamacpp-lookup  Llama(draft_model=LlamaPromptLookupDecoding())          its prompt lookup, its defaults
    llamacpp-draft   Llama(draft_model=<the draft GGUF drafting 4 tokens>)   draft-model speculation through
                                                                             llama-cpp-python's draft interface

llama-cpp-python has no draft-model drafter of its own (llama.cpp's `--model-draft` lives in its command-line
tools), so `llamacpp-draft` plugs a second llama.cpp model into its `LlamaDraftModel` interface: greedy, a
fixed number of tokens, its KV cache kept by llama-cpp-python's own prefix matching. Same prompts (token
ids), threads and stop tokens; greedy. Target passes are counted as calls of `Llama.eval`.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError
from ..models import bundled
from .config import BenchConfig
from .methods import Outcome
from .peer_tools import PeerUnavailableError, cut_at_stop, installed

DRAFT_TOKENS = 4
INSTALL_HINT = (
    "--peers llamacpp needs llama-cpp-python (built from source; on CPUs with AMX build it without: "
    "CMAKE_ARGS=\"-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
    "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'\" pip install llama-cpp-python)"
)


def check_available() -> None:
    if not installed("llama_cpp"):
        raise PeerUnavailableError(INSTALL_HINT)


def gguf_file(source: str | Path) -> str:
    """The GGUF file llama.cpp loads for a bench model (bundled name or .gguf path)."""
    path = bundled.bundled_path(str(source)) if bundled.is_bundled_name(str(source)) else Path(source).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ModelLoadError(f"--peers llamacpp needs GGUF files; {source} is not one")
    return str(path)


def _load(path: str, threads: int, context: int, draft_model=None):
    from llama_cpp import Llama

    try:
        return Llama(
            model_path=path, n_ctx=context, n_batch=512, n_threads=threads, n_threads_batch=threads,
            draft_model=draft_model, verbose=False,
        )  # fmt: skip
    except (ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"llama.cpp cannot load {path} ({exc})") from None


class DraftLlama:
    """llama-cpp-python's LlamaDraftModel interface over a second llama.cpp model: `tokens` greedy drafts."""

    def __init__(self, llm, tokens: int):
        self.llm, self.tokens = llm, tokens

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        drafted = itertools.islice(self.llm.generate(input_ids.tolist(), temp=0.0, top_k=1), self.tokens)
        return np.array(list(drafted), dtype=np.intc)


class LlamaCppPeer:
    kind = "peer"

    def __init__(self, name: str, llm, stop_ids: frozenset[int], k: int = 0):
        self.name, self.llm, self.stop_ids, self.k = name, llm, stop_ids, k
        self.passes = 0
        evaluate = llm.eval

        def counted(tokens):
            self.passes += 1
            return evaluate(tokens)

        llm.eval = counted

    def generate(
        self, prompt_ids: list[int], max_tokens: int, config: BenchConfig, seed: int | None, grammar=None
    ) -> Outcome:  # grammar: never given (the bench refuses peers for structured output)
        self.llm.reset()
        self.passes = 0
        tokens = []
        for token in self.llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True):
            tokens.append(token)
            if token in self.stop_ids or len(tokens) == max_tokens:
                break
        kept, reason = cut_at_stop(tokens, set(self.stop_ids))
        return Outcome(kept, reason, self.passes)


def build_llamacpp_peers(config: BenchConfig, stop_ids: frozenset[int], context: int, threads: int) -> list:
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    context = -(-(context + 64) // 256) * 256  # room for a pass's drafts past the last kept token
    target = gguf_file(config.model)
    peers = [
        LlamaCppPeer("llamacpp-plain", _load(target, threads, context), stop_ids),
        LlamaCppPeer("llamacpp-lookup", _load(target, threads, context, LlamaPromptLookupDecoding()), stop_ids, k=10),
    ]
    if config.draft_model is not None:
        drafter = DraftLlama(_load(gguf_file(config.draft_model), threads, context), DRAFT_TOKENS)
        peers.append(LlamaCppPeer("llamacpp-draft", _load(target, threads, context, drafter), stop_ids, DRAFT_TOKENS))
    return peers


def peer_settings() -> dict:
    return {
        "llamacpp-plain": "llama-cpp-python Llama.generate(temp=0)",
        "llamacpp-lookup": "Llama(draft_model=LlamaPromptLookupDecoding()) (max_ngram_size 2, num_pred_tokens 10)",
        "llamacpp-draft": f"Llama(draft_model=the draft GGUF in llama.cpp, {DRAFT_TOKENS} greedy tokens per pass)",
    }
