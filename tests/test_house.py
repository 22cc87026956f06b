"""Rules of the house that keep the code readable for the next person (docs/architecture.md): short functions (Python
and the C kernels'), calls that name their arguments, and an engine loop that knows no drafting method by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "verispec"
KERNEL_SOURCES = PACKAGE / "kernels" / "csrc"
LONGEST_FUNCTION = 60  # lines, decorators and docstring included
MOST_POSITIONAL = 4  # arguments a call of verispec's own functions passes by position


def _modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")}


def test_no_function_is_longer_than_60_lines():
    long = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]
    assert not long, f"split these: {long}"


def _blank_comments_and_literals(text: str) -> str:
    """C source with its comments and string and character literals blanked, line breaks kept."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = len(text) if end < 0 else end + 2
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
        elif text[i] in "\"'":
            end = i + 1
            while end < len(text) and text[end] != text[i]:
                end += 2 if text[end] == "\\" else 1
            end += 1
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:end]))
        i = end
    return "".join(out)


def _blank_directives(code: str) -> str:
    """C code with its preprocessor lines blanked (a macro's continuation lines too): what macros define is not a
    function of the file; both sides of an #if are read."""
    lines, continued = code.split("\n"), False
    for n, line in enumerate(lines):
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        if directive:
            lines[n] = ""
    return "\n".join(lines)


def _closing_brace(code: str, at: int) -> int:
    """The index of the brace closing the one at `at`."""
    depth = 0
    for i in range(at, len(code)):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        if depth == 0:
            return i
    return len(code) - 1


def c_functions(text: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of each function defined in C source `text`: a top-level brace whose header ends
    with a parameter list (not an initializer, a struct or an enum), from the line of the function's name to its
    closing brace."""
    code = _blank_directives(_blank_comments_and_literals(text))
    found, header_start, i = [], 0, 0
    while i < len(code):
        if code[i] == ";":
            header_start = i + 1
        if code[i] != "{":
            i += 1
            continue
        end = _closing_brace(code, i)
        header = code[header_start:i].rstrip()
        if header.endswith(")") and "=" not in header:
            name = re.search(r"(\w+)\s*(\([^()]*\)\s*)?\([^()]*(\([^()]*\)[^()]*)*\)\s*$", header)
            start = header_start + (name.start(1) if name else 0)
            first = code.count("\n", 0, start) + 1
            found.append((name.group(1) if name else "?", first, code.count("\n", 0, end) + 2 - first))
        header_start = i = end + 1
    return found


def _long_c_functions(sources: dict[str, str]) -> list[str]:
    return [
        f"{path}:{line} {name} ({length} lines)"
        for path, text in sources.items()
        for name, line, length in c_functions(text)
        if length > LONGEST_FUNCTION
    ]


def test_no_c_function_is_longer_than_60_lines():
    sources = {
        str(path.relative_to(PACKAGE)): path.read_text(encoding="utf-8") for path in KERNEL_SOURCES.glob("*.[ch]")
    }
    assert len(sources) > 20
    assert sum(len(c_functions(text)) for text in sources.values()) > 200  # the reader finds the kernels' functions
    long = _long_c_functions(sources)
    assert not long, f"split these: {long}"


def test_the_c_length_check_catches_a_61_line_function():
    """The control: of two functions of 61 and 60 lines, amid what is not a function or is no brace of one (an
    initializer, a struct, a macro's body, braces in comments, strings and characters), the first is reported."""
    lines = [f"    x += {n}; /* {{ */\n" for n in range(58)]
    text = (
        '#include "vsk.h"\n'
        "#define BODY(name) static void name(void) { \\\n    }\n"
        "typedef struct {\n    int a;\n} pair_t;\n"
        "static const int table[] = {1, 2, 3};\n"
        "static inline __attribute__((always_inline)) void sixty_one(int x,\n"
        "                                                             int y) {\n"
        f"{''.join(lines)}"
        "}\n"
        "static int sixty(int x) {\n"
        f"{''.join(lines[:57])}"
        "    return x + '{' + (int)sizeof \"}\";\n"
        "}\n"
    )
    assert [(name, length) for name, _, length in c_functions(text)] == [("sixty_one", 61), ("sixty", 60)]
    assert _long_c_functions({"example.c": text}) == ["example.c:8 sixty_one (61 lines)"]


def _own_callables(modules: dict[Path, ast.Module]) -> set[str]:
    """Names of verispec's functions and classes, but for ctypes structures (built in the C struct's field order)."""
    names = set()
    for tree in modules.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                if not any("Structure" in ast.unparse(base) for base in node.bases):
                    names.add(node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
    return names


def _long_positional_calls(modules: dict[Path, ast.Module]) -> list[str]:
    own = _own_callables(modules)
    found = []
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            positional = sum(1 for arg in node.args if not isinstance(arg, ast.Starred))
            if name in own and positional > MOST_POSITIONAL:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name} ({positional} positional)")
    return found


def test_no_call_of_our_own_functions_passes_more_than_4_arguments_by_position():
    found = _long_positional_calls(_modules())
    assert not found, f"name the arguments of: {found}"


def test_the_positional_call_check_catches_one(tmp_path):
    """The control: a call of six positional arguments to a function of the package is reported."""
    module = ast.parse("def f(a, b, c, d, e, g): ...\nf(1, 2, 3, 4, 5, 6)\nf(1, 2, c=3, d=4, e=5, g=6)\n")
    found = _long_positional_calls({PACKAGE / "example.py": module})
    assert found == ["example.py:2 f (6 positional)"]


# the engine's shared rooms and the loader: they read a method's properties (engine/methods.py), never its name
SHARED_PATH = ["engine/scheduler.py", "engine/admitter.py", "engine/admission.py", "engine/caches.py",
               "engine/draft_round.py", "engine/verification.py", "engine/emission.py", "engine/prefill.py",
               "engine/prefill_pacing.py", "engine/sequence.py", "models/loading.py"]  # fmt: skip


COMMON_WORDS = ("draft", "hybrid")  # method names that are also words of the domain (a draft model, a hybrid model)


def _method_names_in(text: str, names: tuple[str, ...]) -> list[str]:
    """The registered method names `text` mentions: as a word anywhere, in identifiers too (mtp_config,
    AssistantModel, MTP), but the COMMON_WORDS only as strings."""
    found = []
    for name in names:
        if name in COMMON_WORDS:
            word = rf"[\"']{re.escape(name)}[\"']"
        else:
            spellings = "|".join(re.escape(s) for s in {name, name.capitalize(), name.upper()})
            word = rf"(?<![A-Za-z])({spellings})(?![a-z])"
        found += [name] if re.search(word, text) else []
    return found


def test_the_engine_and_the_loader_name_no_drafting_method():
    """Every registered method's name, from the registry itself, in none of the shared path's modules: a new
    drafter is one module and one `register`, with no edit to the scheduler's rooms or the loader."""
    from verispec.engine.methods import method_names

    names = method_names()
    assert {"draft", "suffix", "mtp", "assistant"} <= set(names)
    found = {path: hits for path in SHARED_PATH if (hits := _method_names_in((PACKAGE / path).read_text(), names))}
    assert not found, f"these name a method: {found}"


def test_the_method_name_check_catches_one():
    """The control: a shared module that tests for the MTP layer or builds an assistant is caught."""
    names = ("draft", "mtp", "assistant", "hybrid")
    assert _method_names_in("block_bytes += mtp_config(target)", names) == ["mtp"]
    assert _method_names_in("if config.hybrid: ...", names) == []  # a hybrid model, not the method
    assert _method_names_in("isinstance(draft.model, AssistantModel)", names) == ["assistant"]
    assert _method_names_in('method == "draft"', names) == ["draft"]
    assert _method_names_in("the draft model drafts", names) == []


# the modules every family's files go through: they read a family's entry (models/families.py), never its name
SHARED_LOADER = ["loading.py", "hf_config.py", "hf_source.py", "gguf_config.py", "gguf_source.py", "gguf_native.py",
                 "gguf_converted.py", "native_blocks.py", "weights.py"]  # fmt: skip


def _names_in(text: str, names: set[str], quoted: bool) -> list[str]:
    """The names `text` holds: as a quoted string (a test of one by name), or as a word anywhere."""
    return sorted(
        n for n in names if re.search(rf"[\"']{re.escape(n)}[\"']" if quoted else rf"\b{re.escape(n)}\b", text)
    )


def test_the_shared_readers_name_no_family():
    """No shared reader tests a family by name (every family's names, from models/families.py); the loader names no
    method either (test_the_engine_and_the_loader_name_no_drafting_method)."""
    from verispec.models.families import FAMILIES

    names = {n for f in FAMILIES for n in (f.name, *f.model_types, *f.wrappers, *f.architectures)}
    found = {
        m: _names_in((PACKAGE / "models" / m).read_text(encoding="utf-8"), names, quoted=True) for m in SHARED_LOADER
    }
    assert not {m: n for m, n in found.items() if n}, found


def test_the_names_check_catches_a_family():
    """The control: a family tested by name is found."""
    text = 'if read_config(path).get("model_type") == "gemma4_assistant":  # the assistant, on PyTorch'
    assert _names_in(text, {"gemma4_assistant", "gemma4", "llama"}, quoted=True) == ["gemma4_assistant"]
