"""The docs a newcomer reads first name only what exists: every module, file and class docs/architecture.md names in
backticks is in the tree (a renamed or removed one fails here, not in a reader's search); the README stays short."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "verispec"
README_LINES = 150
EXTERNAL = {"convert_hf_to_gguf.py"}  # llama.cpp's, named where the docs say how fixtures are made


def _defined_names() -> set[str]:
    """Every class, function and module-level name defined in src/, tests/, benchmarks/ and tools/, with methods as
    Class.method too."""
    names: set[str] = set()
    for folder in ("src", "tests", "benchmarks", "tools"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    names.add(node.name)
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            names.add(f"{node.name}.{item.name}")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
    return names


def _file_exists(name: str) -> bool:
    """A path as the docs write it: from the repository's root, from the package, or a module under the package."""
    name = name.rstrip("/")
    if "{" in name:  # models/{config,rope}.py
        head, rest = name.split("{", 1)
        inner, tail = rest.split("}", 1)
        return all(_file_exists(f"{head}{part}{tail}") for part in inner.split(","))
    bases = [ROOT, PACKAGE, *[p for p in PACKAGE.iterdir() if p.is_dir()], ROOT / "tests", PACKAGE / "kernels" / "csrc",
             ROOT / "tests" / "fixtures" / "llamacpp"]  # fmt: skip
    return any((base / name).exists() for base in bases)


def _backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def test_every_file_and_class_the_architecture_names_exists():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    defined = _defined_names()
    missing = []
    for token in _backticked(text):
        word = token.split("(")[0].strip()
        if re.fullmatch(r"[\w./{},-]+\.(py|c|h|json|jsonl|jinja|md|npz)|[\w-]+/([\w-]+/)*", word):
            if not _file_exists(word) and word not in EXTERNAL:
                missing.append(word)
        elif re.fullmatch(r"[A-Z][a-z]\w*(\.\w+)?", word) and not word.isupper():  # a class, or Class.member
            known = word in defined or ("." in word and word.split(".")[0] in defined and _is_field(word))
            if not known:
                missing.append(word)
    assert not missing, f"docs/architecture.md names what the tree lacks: {sorted(set(missing))}"


def _is_field(word: str) -> bool:
    """Class.attribute where the attribute is a dataclass field or set in the class's body."""
    cls, member = word.split(".")
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                source = ast.unparse(node)
                return re.search(rf"\b{re.escape(member)}\b", source) is not None
    return False


def test_the_architecture_check_fails_on_a_name_that_does_not_exist(tmp_path, monkeypatch):
    """The control: a class and a module that are not in the tree are reported."""
    defined = _defined_names()
    assert "BatchedSuffixDrafter" not in defined and "Scheduler" in defined
    assert not _file_exists("engine/proposers.py") and _file_exists("engine/methods.py")
    assert _file_exists("models/{config,rope}.py") and not _file_exists("models/{config,nothing}.py")


def test_the_readme_is_at_most_150_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; keep it to {README_LINES} (details go to docs/)"


def test_the_readmes_results_are_the_generated_section():
    """The README's results sit between the markers benchmarks/readme_results.py writes, and name a machine, a date
    and a commit (the section is made by one command at one commit, never by hand)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    begin = "<!-- results: made by `python benchmarks/readme_results.py` -->"
    assert text.count(begin) == 1 and text.count("<!-- results end -->") == 1
    section = text.split(begin, 1)[1].split("<!-- results end -->", 1)[0]
    assert re.search(r"\d{4}-\d{2}-\d{2}, .+, 2 threads, verispec at [0-9a-f]{7}", section), section[:200]
    assert "| verispec plain |" in section
