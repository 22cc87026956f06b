"""`verispec models`: the models on this machine (the Hugging Face cache, Ollama's store, LM Studio's folders, the
bundled pair once joined) and, for each target, the drafters that fit it, the default first (engine/default_drafter.py
judges them as it would at start-up, without loading: by family, size and token table). `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "List the models verispec finds on this machine, and the drafters that fit each."
    parser.add_argument("--json", action="store_true", help="one JSON object (models, where it looked)")


def listed() -> dict[str, Any]:
    """Every model found, described, with its drafters (the default first, marked)."""
    from .engine.default_drafter import fitting
    from .models import stores
    from .models.catalog import find_models

    found = find_models()
    models = []
    for info in found:
        drafters = [drafter.as_dict() | {"default": i == 0} for i, drafter in enumerate(fitting(info, found))]
        models.append({
            "name": info.name, "family": info.family.name if info.family else None, "size": info.size,
            "quantization": info.quantization, "where": info.where, "path": str(info.path),
            "drafter_only": info.drafter_only, "problem": info.problem, "drafters": drafters,
        })  # fmt: skip
    places = {"hf": str(stores.hub_cache()), "ollama": str(stores.ollama_home()),
              "lmstudio": [str(home) for home in stores.lmstudio_homes()]}  # fmt: skip
    return {"models": models, "looked_in": places}


def _size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError


def _drafter(drafter: dict[str, Any]) -> str:
    mark = "*" if drafter["default"] else ""
    model = f" with {drafter['model']}" if drafter["model"] else " alone" if drafter["method"] == "suffix" else ""
    return f"{mark}{drafter['method']}{model}"


def _table(listing: dict[str, Any]) -> str:
    rows = listing["models"]
    width = max([len("NAME"), *(len(row["name"]) for row in rows)])
    lines = [f"{'NAME':<{width}}  {'FAMILY':<10} {'SIZE':>9}  {'QUANT':<8} WHERE"]
    for row in rows:
        family, quant = row["family"] or "-", row["quantization"] or "-"
        lines.append(f"{row['name']:<{width}}  {family:<10} {_size(row['size']):>9}  {quant:<8} {row['where']}")
        if row["problem"]:
            lines.append(f"    not runnable: {row['problem']}")
        elif row["drafter_only"]:
            lines.append(f"    a drafter for {row['family']} targets (give it as --speculative-model)")
        elif row["drafters"]:
            lines.append("    drafters: " + ", ".join(_drafter(d) for d in row["drafters"]))
    places = listing["looked_in"]
    lines.append("* the default drafter: the one generate, serve and bench choose without --speculative-model")
    lines.append(f"looked in: {places['hf']}, {places['ollama']}, {', '.join(places['lmstudio'])}")
    if not rows:
        lines.append("no models found: give --model a path, or get one (hf download ORG/NAME, ollama pull NAME)")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    listing = listed()
    sys.stdout.write((json.dumps(listing, indent=2) if args.json else _table(listing)) + "\n")
    return 0


COMMANDS = {"models": (_arguments, _run)}
