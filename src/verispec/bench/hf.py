"""Peers in the same run: Hugging Face transformers' own decoding on the same model files.

    hf-plain     model.generate()                                   plain greedy decoding
    hf-assisted  model.generate(assistant_model=draft)              its speculative decoding, its defaults
    hf-lookup    model.generate(prompt_lookup_num_tokens=10)        its n-gram prompt lookup

Same prompts (as token ids), dtype, device and threads; greedy; stops on the same stop tokens. The
number of target passes is counted with a forward hook on the target model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import ModelLoadError
from ..models import bundled
from .config import BenchConfig
from .methods import Outcome
from .peer_tools import PeerUnavailableError, cut_at_stop, installed

PROMPT_LOOKUP_TOKENS = 10
HFLoader = Callable[[str], torch.nn.Module]  # "target" | "draft" -> a transformers causal LM


def hf_loader(config: BenchConfig) -> HFLoader:
    """Loads the bench's target or draft model files with transformers (GGUF file, bundled name or HF folder)."""
    from ..models.loading import resolve_device, resolve_dtype

    dtype, device = resolve_dtype(config.dtype), resolve_device(config.device)
    sources = {"target": config.model, "draft": config.draft_model}
    return lambda role: load_hf_model(str(sources[role]), dtype).to(device)


def load_hf_model(source: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    path = bundled.bundled_path(source) if bundled.is_bundled_name(source) else Path(source).expanduser()
    folder, gguf_file = (path, None) if path.is_dir() else (path.parent, path.name)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), gguf_file=gguf_file, dtype=dtype, local_files_only=True
        )
    except Exception as exc:  # transformers raises many types; all mean "cannot load"
        raise ModelLoadError(f"transformers cannot load {path} for --peers hf ({type(exc).__name__}: {exc})") from None
    return model.eval()


class PassCounter:
    """Counts forward calls of a transformers model (one per target pass, the prompt's included)."""

    def __init__(self, model: torch.nn.Module):
        self.count = 0
        model.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self.count += 1


class HFPeer:
    kind = "peer"
    k = 0

    def __init__(self, name: str, model, counter: PassCounter, stop_ids: list[int], **options):
        self.name, self.model, self.counter, self.stop_ids, self.options = name, model, counter, stop_ids, options

    def generate(
        self, prompt_ids: list[int], max_tokens: int, config: BenchConfig, seed: int | None, grammar=None
    ) -> Outcome:  # grammar: never given (the bench refuses peers for structured output)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.model.device)
        self.counter.count = 0
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                temperature=None, top_p=None, top_k=None, eos_token_id=self.stop_ids, pad_token_id=self.stop_ids[0],
                **self.options,
            )  # fmt: skip
        tokens, reason = cut_at_stop(out[0, len(prompt_ids) :].tolist(), set(self.stop_ids))
        return Outcome(tokens, reason, self.counter.count)


def build_hf_peers(load: HFLoader, stop_ids: frozenset[int], with_draft: bool) -> list[HFPeer]:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its deprecation notices would break the progress bar
    target = load("target")
    counter = PassCounter(target)
    stops = sorted(stop_ids)
    peers = [HFPeer("hf-plain", target, counter, stops)]
    if with_draft:
        peers.append(HFPeer("hf-assisted", target, counter, stops, assistant_model=load("draft")))
    peers.append(HFPeer("hf-lookup", target, counter, stops, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS))
    return peers


def check_available(from_files: bool = True) -> None:
    needed = ("transformers", "accelerate", "gguf") if from_files else ("transformers",)
    for package in needed:
        if not installed(package):
            raise PeerUnavailableError(
                f"--peers hf needs the '{package}' package (transformers loads GGUF files with accelerate and "
                f"gguf): pip install transformers accelerate gguf"
            )


def peer_settings() -> dict:
    return {
        "hf-plain": "generate(do_sample=False)",
        "hf-assisted": "generate(assistant_model=draft), transformers' default assistant settings",
        "hf-lookup": f"generate(prompt_lookup_num_tokens={PROMPT_LOOKUP_TOKENS})",
    }
