"""What the tests of the drafters reading the target's hidden states (EAGLE-3 heads, DFlash drafters) share: the
reference maths their independent readings are written in, a target moved onto the native kernels, a batch of
requests run through the scheduler and judged against plain decoding, and the target's exact law of two tokens."""

from __future__ import annotations

import copy

import torch

from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import Scheduler
from verispec.generator import SpeculativeGenerator
from verispec.models.gguf_native import native_from_dense
from verispec.models.loading import LoadedModel


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotated(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [rows, heads, dim] turned by the rotary at `positions` (HF's rotate-half layout)."""
    dim = x.shape[-1]
    angles = positions[:, None].double() * (1.0 / theta ** (torch.arange(0, dim, 2).double() / dim))[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1).float()[:, None], torch.cat([angles.sin()] * 2, -1).float()[:, None]
    return x * cos + torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], -1) * sin


def on_native(target: LoadedModel) -> LoadedModel:
    """A copy of `target` on the native kernels."""
    return LoadedModel(target.name, target.path, native_from_dense(copy.deepcopy(target.model)), target.tokenizer)


def alone_as_plain(spec: SpeculativeGenerator, plain: SpeculativeGenerator, prompts: list) -> int:
    """Each prompt alone through `spec`: greedy output token for token, and seeds 3 and 8's sampled texts, as `plain`
    writes them (asserted); returns the drafts accepted over the greedy runs."""
    accepted = 0
    for prompt in prompts:
        out = spec.generate(prompt, max_tokens=40, ignore_eos=True, temperature=0)
        assert out.token_ids == plain.generate(prompt, max_tokens=40, ignore_eos=True, temperature=0).token_ids
        accepted += out.stats.accepted
        for seed in (3, 8):
            sampled = dict(max_tokens=24, ignore_eos=True, temperature=0.8, seed=seed)
            assert spec.generate(prompt, **sampled).token_ids == plain.generate(prompt, **sampled).token_ids
    return accepted


def run_as_plain(scheduler: Scheduler, target: LoadedModel, requests: list, max_tokens: int = 30) -> dict:
    """`requests` (name, prompt ids, SamplingParams) submitted together and run to the end; each output is asserted
    plain decoding's for its prompt and seed. Returns the outputs by name."""
    outputs = {}
    for name, ids, params in requests:
        sink = lambda event, name=name: outputs.update({name: event.output}) if isinstance(event, FinishEvent) else None  # noqa: E731
        scheduler.submit(
            EngineRequest(request_id=name, prompt_ids=ids, params=params, max_tokens=max_tokens, sink=sink)
        )
    scheduler.run_until_idle()
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    for name, ids, params in requests:
        expected = plain.generate(ids, max_tokens=max_tokens, temperature=params.temperature, seed=params.seed)
        assert outputs[name].token_ids == expected.token_ids, name
    return outputs


def exact_first_two(model, prompt: list[int], vocab: int) -> dict:
    """The target's exact law of its first two sampled tokens at temperature 1 after `prompt` (the first among the
    first `vocab` ids)."""

    def probs(seq: list[int]) -> torch.Tensor:
        return model(torch.tensor([seq]), model.new_cache(max_len=len(seq)), [0])[0, -1].float().softmax(-1)

    first = probs(prompt)
    return {(a, b): float(first[a]) * float(q) for a in range(vocab) for b, q in enumerate(probs([*prompt, a]))}
