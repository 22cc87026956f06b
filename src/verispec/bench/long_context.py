"""Long prompts from text the install already has: the Python standard library's own source files.

Three kinds of chat request, the ones long-context users send, each with 1,000 to 4,000 tokens of context
(about 3.3 characters per token of Python source; the sizes cycle so that every kind has each length):

    long-summary   a module's source (cut at a line), then "summarise this module"
    long-extract   a module's source, then "list every function that raises ValueError"
    long-rag       passages (functions' signatures and docstrings from several modules), then a question
                   about one of them, to be answered from the passages only
    long           the three interleaved (summary, extract, rag, summary, ...)

The sources are read through `inspect`, so a prompt is the same wherever the same Python runs.
"""

from __future__ import annotations

import ast
import importlib
import inspect

CHARS = (3600, 7500, 11000, 14500)  # about 1k, 2k, 3k and 3.8k tokens of context
SUMMARY_MODULES = ("statistics", "fractions", "textwrap", "shlex", "calendar", "heapq", "difflib", "configparser",
                   "tempfile", "pprint", "functools", "contextlib")  # fmt: skip
EXTRACT_MODULES = ("ipaddress", "uuid", "base64", "random", "urllib.parse", "zipfile", "datetime", "enum",
                   "graphlib", "configparser", "wave", "string")  # fmt: skip
RAG_MODULES = ("statistics", "fractions", "textwrap", "shlex", "base64", "uuid", "bisect", "heapq", "random",
               "functools", "operator", "urllib.parse", "email.utils", "shutil", "tempfile", "calendar")  # fmt: skip
KINDS = ("long-summary", "long-extract", "long-rag")


def long_requests(kind: str) -> list[tuple[str, list[dict]]]:
    """(id, chat messages) of a long-context dataset (`long` interleaves the three kinds)."""
    if kind == "long":
        groups = [long_requests(k) for k in KINDS]
        return [request for row in zip(*groups, strict=False) for request in row]
    if kind == "long-summary":
        return [_summary(module, CHARS[i % len(CHARS)]) for i, module in enumerate(SUMMARY_MODULES)]
    if kind == "long-extract":
        return [_extract(module, CHARS[i % len(CHARS)]) for i, module in enumerate(EXTRACT_MODULES)]
    if kind == "long-rag":
        return [_rag(i, CHARS[i % len(CHARS)]) for i in range(12)]
    raise ValueError(f"unknown long-context dataset {kind!r}")


def _source(module: str, chars: int) -> str:
    """The module's source, cut at the last line that fits `chars`."""
    text = inspect.getsource(importlib.import_module(module))
    return text if len(text) <= chars else text[: text.rfind("\n", 0, chars) + 1]


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _summary(module: str, chars: int) -> tuple[str, list[dict]]:
    prompt = (
        f"Here is the source of Python's `{module}` module (its beginning):\n\n```python\n{_source(module, chars)}```"
        "\n\nSummarise what this code does: its purpose, then its main functions and classes, one line each."
    )
    return f"long-summary-{module}-{chars}", _user(prompt)


def _extract(module: str, chars: int) -> tuple[str, list[dict]]:
    prompt = (
        f"Here is part of the source of Python's `{module}` module:\n\n```python\n{_source(module, chars)}```\n\n"
        "List every function or method in this code that raises ValueError, one per line as "
        "`name: the condition under which it raises`. Quote the condition as it is written in the code."
    )
    return f"long-extract-{module}-{chars}", _user(prompt)


def _passages(module: str) -> list[tuple[str, str]]:
    """(qualified name, passage) for each public function of `module` with a docstring: its signature line and
    its docstring."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and ast.get_docstring(node):
            signature = f"{module}.{node.name}({ast.unparse(node.args)})"
            found.append((f"{module}.{node.name}", f"{signature}\n{ast.get_docstring(node)}"))
    return found


def _rag(index: int, chars: int) -> tuple[str, list[dict]]:
    """Passages from modules taken in turn from RAG_MODULES (starting at `index`) until `chars` is reached; the
    question is about a passage in the middle."""
    passages: list[tuple[str, str]] = []
    size, turn = 0, index
    while size < chars:
        for name, passage in _passages(RAG_MODULES[turn % len(RAG_MODULES)]):
            if size + len(passage) > chars and passages:
                break
            passages.append((name, passage))
            size += len(passage) + 20
        turn += 1
        if turn - index > len(RAG_MODULES):
            break
    name = passages[len(passages) // 2][0]
    numbered = "\n\n".join(f"[{i + 1}] {passage}" for i, (_, passage) in enumerate(passages))
    prompt = (
        f"Answer the question using only the numbered passages below, and cite the passage you use.\n\n{numbered}\n\n"
        f"Question: what does `{name}` do, what does it return, and what are its parameters?"
    )
    return f"long-rag-{index}-{chars}", _user(prompt)
