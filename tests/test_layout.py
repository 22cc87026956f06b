"""The package's import graph: layers that only import downwards, and no import cycles.

Every `import` and `from ... import` inside src/verispec counts, those inside functions included (a lazy
import is still a dependency). Layers, from the ground up (a module takes the layer of its longest listed
prefix: `models.model` is the model layer, the rest of `models` the weights layer):

    0 foundation   errors, json_text, defaults, decoding/ (acceptance, sampling, adjustments, grammar, logprobs,
                   stopping, stats), models.config, models.rope, models.tokenizer, models.bundled, models.converted
    1 kernels      kernels/ (the native library and its Python face)
    2 model        models.model, models.feed_forward, models.kv_cache (the transformer, its parts and its paged cache;
                   know no weight format),
                   models.delta_net, models.recurrent_state (linear attention and its state), models.masks (a
                   pass's attention masks), models.pass_shape and models.shaped_attention (every pass at one
                   shape), models.hidden_states (what a pass hands a drafter), models.mtp, models.assistant,
                   models.eagle3 (the drafters trained with a target), models.trained_drafter (what they share)
    3 weights      models/ (quantize, weights, weight_forms, family, hf_config, gguf_config, hf_source,
                   native_blocks, family_gemma, family_qwen35, family_gpt_oss, families, gguf_source, gguf_native,
                   gguf_converted, draft_head, passes, loading), testing
    4 engine       engine/ (scheduler, methods, proposer, drafting, draft_model, prompt_lookup, suffix, policy, ...)
    5 generator    generator (one request through the engine)
    6 front ends   arguments, server/, bench/, listing (`verispec models`)
    7 command line cli, __main__, the package's __init__
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "verispec"

LAYERS = {
    "errors": 0, "json_text": 0, "defaults": 0, "decoding": 0, "models.config": 0, "models.rope": 0,
    "models.tokenizer": 0, "models.gguf_vocab": 0, "models.bundled": 0, "models.converted": 0,
    "kernels": 1,
    "models.model": 2, "models.kv_cache": 2, "models.delta_net": 2, "models.recurrent_state": 2, "models.mtp": 2,
    "models.assistant": 2, "models.feed_forward": 2, "models.eagle3": 2, "models.hidden_states": 2, "models.masks": 2,
    "models.trained_drafter": 2, "models.pass_shape": 2, "models.shaped_attention": 2,
    "models": 3, "testing": 3,
    "engine": 4,
    "generator": 5,
    "arguments": 6, "server": 6, "bench": 6, "listing": 6,
    "cli": 7, "__main__": 7, "__init__": 7,
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """The verispec modules `path` imports (as dotted names below verispec)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.split(".")[0] == "verispec":
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:  # `from . import hf` imports the module hf
                candidate = [*target, alias.name]
                found.add(".".join(candidate) if _exists(candidate) else ".".join(target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "verispec":
                    found.add(".".join(alias.name.split(".")[1:]))
    return {name for name in found if name}


def _exists(parts: list[str]) -> bool:
    base = PACKAGE.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def layer(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):  # the longest listed prefix
        if (prefix := ".".join(parts[:end])) in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"module {module} has no layer: add it to LAYERS in {Path(__file__).name}")


def graph() -> dict[str, set[str]]:
    return {module_name(path): imports(path) for path in PACKAGE.rglob("*.py")}


def test_every_import_runs_down_or_sideways_in_the_layers():
    upward = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in graph().items()
        for target in targets
        if module != "__init__" and layer(target) > layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if target not in edges:
                continue  # a package's __init__ re-export or a name inside a module; checked as its module
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target] if target in path else [module, target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """Negative control: a package with a cycle and an upward import is caught."""
    fake = tmp_path / "verispec"
    (fake / "engine").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "models").mkdir()
    (fake / "models" / "__init__.py").write_text("")
    (fake / "models" / "model.py").write_text("from ..engine import scheduler\n")  # layer 2 -> layer 4
    (fake / "engine" / "scheduler.py").write_text("from ..models.model import Transformer\n")  # and back: a cycle
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    for check in (test_every_import_runs_down_or_sideways_in_the_layers, test_the_import_graph_has_no_cycles):
        try:
            check()
        except AssertionError:
            continue
        raise AssertionError(f"{check.__name__} passed on a broken package")
