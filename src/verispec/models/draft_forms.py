"""The draft's weight form chosen by measurement on this machine (`--speculative-quantization auto`, the default
for a GGUF draft on the native kernels).

The target decides every token, so the draft's precision is a speed setting: a coarser draft reads fewer bytes per
step and proposes nearly the same tokens (the bundled draft requantized to Q4_0: 235 MB per step instead of 281 MB,
alpha 0.789 against 0.790 on chat prompts, docs/speed.md). Which form drafts fastest depends on the machine (memory
bandwidth against the kernels' arithmetic: AVX2 without VNNI unpacks 4-bit blocks at a cost), so each candidate's
decode step is timed once, on a 64-token context, its steps interleaved with the other candidates' so that other
load on the machine hits all alike, and the fastest is kept unless it saves less than MARGIN of a step. The choice,
with its figures, is cached per draft file, CPU, kernel path and thread count (`draft-forms.json` beside the
prepared files) and printed.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from . import bundled, names
from .weight_forms import COARSE_DRAFT

CANDIDATES = ("gguf", COARSE_DRAFT)  # the draft's blocks as stored, and its layers requantized to Q4_0
MARGIN = 0.03  # a coarser form must save at least this share of a draft step (below: timing noise)
CONTEXT, STEPS, ROUNDS = 64, 8, 5


def choose(source: str, load: Callable[[str, str], torch.nn.Module], progress: bool = True) -> str:
    """The form the draft `source` (a bundled name, a GGUF file, a name names.py resolves) drafts fastest in here,
    measured once and cached; 'gguf' where there is nothing to choose (no native kernels, or not a GGUF file).
    `load(source, form)`: the model in that form (loading.py's, passed in: loading calls this module)."""
    from ..kernels import native

    path = names.locate(source, progress=progress)
    if not (path.is_file() and native.available()):
        return "gguf"
    key = _key(path, native)
    cache = bundled.cache_dir() / "draft-forms.json"
    known = _read(cache)
    if not _valid(known.get(key)):  # not measured yet here, or an entry edited out of shape: measured again
        known[key] = _measure(source, load)
        _write(cache, known)
    chosen = known[key]
    if progress:
        steps = ", ".join(f"{form} {ms:.2f} ms" for form, ms in chosen["step_ms"].items())
        print(f"draft form: {chosen['form']} (a draft step's layers: {steps}; measured on this machine, {cache})",
              file=sys.stderr)  # fmt: skip
    return chosen["form"]


def _key(path: Path, native) -> str:
    native.claim_threads()  # the pool the models will run on (--threads), before the key names its size
    stat = path.resolve().stat()
    return f"{path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}|{_cpu_name()}|{native.isa()}|{native.threads()}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read(cache: Path) -> dict:
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _valid(entry: object) -> bool:
    if not isinstance(entry, dict) or entry.get("form") not in CANDIDATES or not isinstance(entry.get("step_ms"), dict):
        return False
    return all(isinstance(ms, int | float) for ms in entry["step_ms"].values())


def _write(cache: Path, known: dict) -> None:
    """Whole or not at all: another process reading it meanwhile sees the old file or the new one."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, cache)


def _measure(source: str, load: Callable[[str, str], torch.nn.Module]) -> dict:
    models = {form: load(source, form) for form in CANDIDATES}
    samples: dict[str, list[float]] = {form: [] for form in CANDIDATES}
    for _ in range(ROUNDS):
        for form, model in models.items():
            samples[form].append(_step_seconds(model))
    step = {form: statistics.median(times) for form, times in samples.items()}
    best = min(step, key=step.__getitem__)
    form = best if step[best] < (1 - MARGIN) * step["gguf"] else "gguf"
    return {"form": form, "step_ms": {f: round(s * 1e3, 3) for f, s in step.items()}}


@torch.inference_mode()
def _step_seconds(model) -> float:
    """The median seconds of one decode step's layers at a CONTEXT-token context (a head of 16 rows: the draft's
    restricted head is Q4_0 in every form, draft_head.py, and would only dilute the difference)."""
    ids = torch.arange(CONTEXT + STEPS).reshape(1, -1) % 1000 + 100
    cache = model.new_cache(max_len=CONTEXT + STEPS)
    head = model.lm_head.select_rows(torch.arange(16))
    model(ids[:, :CONTEXT], cache, [0], head=head)
    times = []
    for t in range(CONTEXT, CONTEXT + STEPS):
        begin = time.perf_counter()
        model(ids[:, t : t + 1], cache, [0], head=head)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)
