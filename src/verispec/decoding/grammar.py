"""Structured output: a grammar every generated token must stay within — a JSON schema, any JSON object, a
regular expression, a Lark (or GBNF) grammar, or a choice among strings — through llguidance (why that
library: docs/structured-output.md).

    GrammarCompiler   per tokenizer: compiles a GrammarSpec into a Grammar (cached; invalid specs raise)
    Grammar           compiled, immutable, shared by every request that asks for it
    GrammarMatcher    one sequence's state: the tokens it has emitted

A mask is a bool tensor over the model's logits (True = allowed). Once the grammar is complete only the stop
tokens are allowed, so the sequence ends. A matcher that fails (the grammar exceeds the library's limits at
some state: a choice among too many strings, a cycle of $refs) raises GrammarError: its request fails with
the library's message, never ends as if the grammar were complete.

What reaches the library is bounded first (GrammarSpec.check: size, nesting, definitions, rules, choices):
the library compiles grammars by recursion on a native stack, so a long enough chain of rules crashes the
process. Grammars are compiled on a thread of GRAMMAR_STACK_BYTES; the server also checks each new grammar
in a worker process with the default 8 MiB stack first (server/grammar_worker.py), so a grammar that would
crash, or runs past the time limit, costs that worker, not the server.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import torch

from ..errors import InvalidParameterError
from ..json_text import JsonTextError, parse_json
from ..models.tokenizer import Tokenizer

KINDS = ("json_object", "json_schema", "regex", "grammar", "choice")

# What a grammar may be (the limits are published in docs/structured-output.md and answered in each 400).
MAX_GRAMMAR_BYTES = 256 * 1024  # a schema, regex, grammar or choice list as text
MAX_SCHEMA_DEPTH = 64  # nesting of a JSON schema's objects and arrays
MAX_SCHEMA_DEFINITIONS = 256  # entries of its $defs / definitions (a chain of ~900 crashed an 8 MiB stack)
MAX_GRAMMAR_RULES = 1000  # rules of a Lark or GBNF grammar (a chain of ~2,500 crashed an 8 MiB stack)
MAX_CHOICES = 1000  # strings of a choice (the library's parser allows 2,000 items in a row)
# A regex: a `regex` constraint, a JSON schema's `pattern` or `patternProperties` key, a custom tool's format. Shown to
# the model where a tool's schema holds it: a 64 KiB regex was a prompt of 8,000-60,000 tokens (minutes of prefill)
MAX_REGEX_BYTES = 8 * 1024
GRAMMAR_STACK_BYTES = 64 * 2**20  # the threads that compile grammars: 8x the stack the server's worker checks with
# Whitespace between a JSON answer's tokens: compact or pretty-printed (up to 32 spaces or tabs, one line break, up
# to 32 more of indentation), never a run. Unbounded whitespace (the library's default) let models fill answers
# with it: a string cut at its maxLength was followed by blanks up to max_tokens (docs/structured-output.md).
JSON_WHITESPACE = r"[ \t]{0,32}(\r?\n[ \t]{0,32})?"
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.-]*(?:\.-?\d+)?[ \t]*(?::|::=)", re.MULTILINE)  # after _LINE_BREAKS


class GrammarError(InvalidParameterError):
    """The grammar cannot be built, exceeds a limit, or made the library fail while generating."""


def check_limits(kind: str, value: str) -> None:
    """Raises InvalidParameterError when a constraint exceeds what verispec hands the grammar library."""
    size = len(value.encode())
    if size > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the {kind.replace('_', ' ')} has {size} bytes; the limit is {MAX_GRAMMAR_BYTES}")
    if kind == "json_schema":
        _check_schema(value)
    elif kind == "regex":
        check_regex(value, "the regex")
    elif kind == "grammar" and (rules := count_rules(value)) > MAX_GRAMMAR_RULES:
        raise GrammarError(f"the grammar defines {rules} rules; the limit is {MAX_GRAMMAR_RULES}")
    elif kind == "choice" and (count := len(parse_json(value, "the choice"))) > MAX_CHOICES:
        raise GrammarError(f"the choice has {count} strings; the limit is {MAX_CHOICES}")


def count_rules(grammar: str) -> int:
    """The rules a Lark or GBNF grammar defines: names followed by ':' or '::=' at a line's start, where any of the
    characters the library reads as a line break or blank begins a line (a '\r' before each rule once hid them)."""
    return len(_RULE.findall(grammar.translate(_LINE_BREAKS)))


_LINE_BREAKS = str.maketrans({"\r": "\n", "\f": "\n", "\v": "\n"})


def check_regex(regex: str, what: str) -> None:
    """Raises GrammarError when `regex` (named `what`) is longer than MAX_REGEX_BYTES."""
    if (size := len(regex.encode())) > MAX_REGEX_BYTES:
        raise GrammarError(f"{what} has {size} bytes; the limit is {MAX_REGEX_BYTES}")


def _check_schema(text: str) -> None:
    try:
        schema = parse_json(text, "the JSON schema")
    except JsonTextError as exc:
        if "nests deeper" in str(exc):
            raise GrammarError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels") from None
        return  # not JSON: the library says so when it compiles
    check_schema(schema)


def check_schema(schema: object) -> None:
    """Raises GrammarError when a JSON schema (parsed) exceeds the limits: its nesting, definitions, the places its
    $refs point to, its regexes."""
    stack, definitions, references = [(schema, 1)], 0, set()
    while stack:  # depth first, without recursion
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(node, dict):
            for key in ("$defs", "definitions"):
                definitions += len(node[key]) if isinstance(node.get(key), dict) else 0
            if isinstance(node.get("$ref"), str):
                references.add(node["$ref"])
            if isinstance(node.get("pattern"), str):
                check_regex(node["pattern"], "a JSON schema's pattern")
            keyed = node.get("patternProperties")
            for regex in keyed if isinstance(keyed, dict) else ():
                check_regex(regex, "a JSON schema's patternProperties key")
            stack += [(child, depth + 1) for child in node.values()]
        elif isinstance(node, list):
            stack += [(child, depth + 1) for child in node]
    if definitions > MAX_SCHEMA_DEFINITIONS:
        raise GrammarError(f"the JSON schema has {definitions} definitions; the limit is {MAX_SCHEMA_DEFINITIONS}")
    # a chain of references through any path (#/properties/a/...) recurses as deep as one through $defs
    if len(references) > MAX_SCHEMA_DEFINITIONS:
        message = f"the JSON schema refers ($ref) to {len(references)} places; the limit is {MAX_SCHEMA_DEFINITIONS}"
        raise GrammarError(message)


def parser_limits():
    """llguidance's limits, with short error messages (its verbose ones print the parser's state)."""
    from llguidance import LLParserLimits

    return LLParserLimits(verbose_errors=False)


def run_with_stack(function, *args):
    """`function(*args)` on a new thread of GRAMMAR_STACK_BYTES (the library's recursion needs room, whichever
    thread asks); its exception is raised here."""
    result: list = []

    def target() -> None:
        try:
            result.append((True, function(*args)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result.append((False, exc))

    thread = threading.Thread(target=target, name="verispec-grammar", daemon=True)
    start_with_grammar_stack(thread)
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


def start_with_grammar_stack(thread: threading.Thread) -> None:
    """Start `thread` with a stack of GRAMMAR_STACK_BYTES (a thread that compiles grammars or steps matchers)."""
    with _STACK_LOCK:  # the stack size is process-wide: set it only for this thread's creation
        previous = threading.stack_size(GRAMMAR_STACK_BYTES)
        try:
            thread.start()
        finally:
            threading.stack_size(previous)


_STACK_LOCK = threading.Lock()


@dataclass(frozen=True)
class GrammarSpec:
    """kind: one of KINDS; value: the JSON schema as JSON text, the regex, the Lark/GBNF source, or the
    choices as a JSON list of strings (json_object needs none)."""

    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidParameterError(f"unknown grammar kind {self.kind!r} (choose from {', '.join(KINDS)})")
        if self.kind == "choice":
            try:
                choices = parse_json(self.value, "the choice")
            except JsonTextError:
                choices = None
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
                # an empty choice would make an empty answer a right one, indistinguishable from a failure
                raise InvalidParameterError("invalid choice: it needs a non-empty JSON list of non-empty strings")
        check_limits(self.kind, self.value)

    def library_input(self) -> tuple[str, str]:
        """(kind, value) as llguidance's `grammar_from` reads them: json_object is the schema of any object, and
        a JSON schema gets JSON_WHITESPACE unless it sets its own `x-guidance` (the library's formatting key)."""
        kind, value = self.kind, self.value
        if kind == "json_object":
            kind, value = "json_schema", '{"type": "object"}'
        if kind != "json_schema":
            return kind, value
        try:
            schema = parse_json(value, "the JSON schema")
        except JsonTextError:
            return kind, value  # the library says what is wrong with it
        if isinstance(schema, dict) and "x-guidance" not in schema:
            value = json.dumps({"x-guidance": {"whitespace_pattern": JSON_WHITESPACE}, **schema})
        return kind, value

    def source(self) -> str:
        """The grammar in llguidance's input format (its `grammar_from` reads GBNF as well as Lark)."""
        from llguidance import grammar_from

        try:
            return grammar_from(*self.library_input())
        except Exception as exc:  # noqa: BLE001 - its parsers raise several types for a bad grammar text
            raise GrammarError(f"invalid {self.kind.replace('_', ' ')}: {short_message(str(exc))}") from None


def short_message(message: str) -> str:
    """llguidance's message in one line: its first line and its `error:` lines (without the source diagram or
    the parser's state)."""
    lines = [line.strip() for line in message.split("<state>")[0].splitlines() if line.strip()]
    text = " ".join(lines[:1] + [line for line in lines[1:] if line.startswith("error")])
    return _PLAIN_WORDS.get(text, text)


# The library's terse errors, said plainly.
_PLAIN_WORDS = {
    "NoExtensionBias": "it admits no output at all (a $ref cycle, or a rule that only refers to itself)",
}


class Grammar:
    """A compiled grammar: `prototype` is a matcher at its start, which each sequence's matcher copies (a copy
    costs microseconds; compiling again could cost a second of the scheduler's thread)."""

    def __init__(self, compiler: GrammarCompiler, source: str, prototype):
        self.compiler, self.source, self.prototype = compiler, source, prototype

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self.prototype.deep_copy(), self.compiler)


class GrammarCompiler:
    """Compiles specs for one tokenizer and a logits width (vocab_size, which may exceed the tokenizer's: the
    rows beyond it are never allowed)."""

    CACHED = 64  # compiled grammars kept: clients send the same schema with every request

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_ids = sorted(i for i in tokenizer.stop_token_ids if i < vocab_size)
        self._compiled: OrderedDict[GrammarSpec, Grammar] = OrderedDict()
        self._lock = threading.Lock()  # the server compiles in worker threads

    @cached_property
    def ll_tokenizer(self):
        """llguidance's view of the tokenizer (built on first use: about 1.5 s for 150k tokens)."""
        from llguidance import LLTokenizer

        return LLTokenizer(self.tokenizer.raw.to_str(), n_vocab=self.vocab_size, eos_token=self.stop_ids)

    @cached_property
    def stop_mask(self) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.stop_ids] = True
        return mask

    def cached(self, spec: GrammarSpec) -> Grammar | None:
        with self._lock:
            return self._compiled.get(spec)

    def compile(self, spec: GrammarSpec, source: str | None = None) -> Grammar:
        """Raises GrammarError, with llguidance's message, for a grammar it cannot build or that fails at its
        start. `source`: the spec's grammar text as a worker process built and checked it (else built here)."""
        with self._lock:
            if spec in self._compiled:
                self._compiled.move_to_end(spec)
                return self._compiled[spec]
            tokenizer = self.ll_tokenizer
        if source is None:
            source = run_with_stack(spec.source)
        prototype = run_with_stack(_start_matcher, tokenizer, source, spec.kind)
        with self._lock:
            grammar = self._compiled[spec] = Grammar(self, source, prototype)
            while len(self._compiled) > self.CACHED:
                self._compiled.popitem(last=False)
        return grammar


def _start_matcher(tokenizer, source: str, kind: str):
    """A matcher at the grammar's start, its first mask computed: a grammar that fails there ($ref cycles,
    limits) raises GrammarError now, not an empty answer later."""
    from llguidance import LLMatcher

    failed, messages = LLMatcher.validate_grammar_with_warnings(source, tokenizer, limits=parser_limits())
    if failed:
        raise GrammarError(f"invalid {kind.replace('_', ' ')}: {short_message(messages[0])}")
    matcher = LLMatcher(tokenizer, source, log_level=0, limits=parser_limits())
    if not matcher.is_error():
        matcher.compute_logit_bias()
    if matcher.is_error():
        raise GrammarError(f"invalid {kind.replace('_', ' ')}: {short_message(matcher.get_error())}")
    return matcher


class GrammarMatcher:
    def __init__(self, matcher, compiler: GrammarCompiler):
        self.matcher, self.compiler = matcher, compiler
        self.seconds = 0.0  # spent in this matcher (the bench reports the grammar's share of a step)

    def advance(self, tokens: list[int]) -> None:
        """The sequence emitted `tokens` (stop tokens excluded); they are within the grammar by construction."""
        begin = time.perf_counter()
        self._consume(tokens)
        self.seconds += time.perf_counter() - begin

    def mask_after(self, drafted: list[int]) -> torch.Tensor:
        """The mask [V] at the state after the emitted tokens and `drafted` (drafted under these masks)."""
        begin = time.perf_counter()
        consumed = self._consume(drafted)
        mask = self._mask() if consumed == len(drafted) else self.compiler.stop_mask
        self.matcher.rollback(consumed)
        self.seconds += time.perf_counter() - begin
        return mask

    def masks(self, tokens: list[int]) -> tuple[torch.Tensor, int]:
        """([m + 1, V] masks, m): m is how many of `tokens` the grammar allows in a row from the current state,
        row i the mask after the first i of them (a verification pass's rows). The state is left as it was."""
        begin = time.perf_counter()
        rows, consumed, valid = [self._mask()], 0, 0
        for token in tokens:
            if not rows[-1][token]:
                break
            valid += 1
            if token in self.compiler.stop_ids or not self.matcher.consume_token(token):
                self._raise_if_failed()
                rows.append(self.compiler.stop_mask)  # the sequence ends at this token: the row is never used
                break
            consumed += 1
            rows.append(self._mask())
        self.matcher.rollback(consumed)
        self.seconds += time.perf_counter() - begin
        return torch.stack(rows), valid

    def tree_masks(self, tokens: list[int], parents: list[int]) -> tuple[torch.Tensor, list[int]]:
        """A token tree's masks (tokens[i] after node parents[i], -1: after the current state; parents first) and
        the nodes the grammar allows: a node is kept when its parent is and its token is allowed there. Row 0 is
        the mask at the current state, row i + 1 the mask after node i's path (a kept node's; the stop mask where
        its token ends the sequence, whose children are dropped). The state is left as it was."""
        begin = time.perf_counter()
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(parents):
            children.setdefault(parent, []).append(i)
        rows: list[torch.Tensor | None] = [self._mask(), *([None] * len(tokens))]
        kept: list[int] = []

        def visit(node: int) -> None:  # node -1: the current state; the matcher stands after node's path
            for child in children.get(node, []):
                token = tokens[child]
                if not rows[node + 1][token]:
                    continue
                kept.append(child)
                if token in self.compiler.stop_ids or not self.matcher.consume_token(token):
                    self._raise_if_failed()
                    rows[child + 1] = self.compiler.stop_mask  # the sequence ends at this token
                    continue
                rows[child + 1] = self._mask()
                visit(child)
                self.matcher.rollback(1)

        visit(-1)
        self.seconds += time.perf_counter() - begin
        kept.sort()
        return torch.stack([rows[0], *(rows[i + 1] for i in kept)]), kept

    def _consume(self, tokens: list[int]) -> int:
        consumed = 0
        for token in tokens:
            if token in self.compiler.stop_ids or self.matcher.is_stopped() or not self.matcher.consume_token(token):
                self._raise_if_failed()
                break
            consumed += 1
        return consumed

    def _raise_if_failed(self) -> None:
        """The library failed at this state (a limit: its error state is final): the request fails with it."""
        if self.matcher.is_error():
            raise GrammarError(f"structured output failed: {short_message(self.matcher.get_error())}")

    def _mask(self) -> torch.Tensor:
        if self.matcher.is_stopped():
            return self.compiler.stop_mask
        self._raise_if_failed()
        allowed = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8)
        self._raise_if_failed()
        return allowed[: self.compiler.vocab_size] > 0
