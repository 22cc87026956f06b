"""Structured output: a grammar every generated token must stay within — a JSON schema, any JSON object, a
regular expression, a Lark (or GBNF) grammar, or a choice among strings — through llguidance (why that
library: docs/structured-output.md).

    GrammarCompiler   per tokenizer: compiles a GrammarSpec into a Grammar (cached; invalid specs raise)
    Grammar           compiled, immutable, shared by every request that asks for it
    GrammarMatcher    one sequence's state: the tokens it has emitted

A mask is a bool tensor over the model's logits (True = allowed). Once the grammar is complete, or the
matcher has failed, only the stop tokens are allowed, so the sequence ends.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import torch

from .errors import InvalidParameterError
from .tokenizer import Tokenizer

KINDS = ("json_object", "json_schema", "regex", "grammar", "choice")


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
                choices = json.loads(self.value)
            except ValueError:
                choices = None
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise InvalidParameterError("invalid choice: it needs a non-empty JSON list of strings")

    def source(self) -> str:
        """The grammar in llguidance's input format (its `grammar_from` reads GBNF as well as Lark)."""
        from llguidance import grammar_from

        if self.kind == "json_object":
            return grammar_from("json_schema", '{"type": "object"}')
        try:
            return grammar_from(self.kind, self.value)
        except Exception as exc:  # noqa: BLE001 - its parsers raise several types for a bad grammar text
            raise InvalidParameterError(f"invalid {self.kind.replace('_', ' ')}: {_one_line(str(exc))}") from None


def _one_line(message: str) -> str:
    """llguidance's message in one line: its first line and its `error:` lines (without the source diagram)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines[:1] + [line for line in lines[1:] if line.startswith("error")])


class Grammar:
    def __init__(self, compiler: GrammarCompiler, source: str):
        self.compiler, self.source = compiler, source

    def matcher(self) -> GrammarMatcher:
        from llguidance import LLMatcher

        return GrammarMatcher(LLMatcher(self.compiler.ll_tokenizer, self.source, log_level=0), self.compiler)


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

    def compile(self, spec: GrammarSpec) -> Grammar:
        """Raises InvalidParameterError, with llguidance's message, for a grammar it cannot build."""
        from llguidance import LLMatcher

        with self._lock:
            if spec in self._compiled:
                self._compiled.move_to_end(spec)
                return self._compiled[spec]
            tokenizer = self.ll_tokenizer
        source = spec.source()
        failed, messages = LLMatcher.validate_grammar_with_warnings(source, tokenizer)
        if failed:
            raise InvalidParameterError(f"invalid {spec.kind.replace('_', ' ')}: {_one_line(messages[0])}")
        with self._lock:
            grammar = self._compiled[spec] = Grammar(self, source)
            while len(self._compiled) > self.CACHED:
                self._compiled.popitem(last=False)
        return grammar


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
                rows.append(self.compiler.stop_mask)  # the sequence ends at this token: the row is never used
                break
            consumed += 1
            rows.append(self._mask())
        self.matcher.rollback(consumed)
        self.seconds += time.perf_counter() - begin
        return torch.stack(rows), valid

    def _consume(self, tokens: list[int]) -> int:
        consumed = 0
        for token in tokens:
            if token in self.compiler.stop_ids or self.matcher.is_stopped() or not self.matcher.consume_token(token):
                break
            consumed += 1
        return consumed

    def _mask(self) -> torch.Tensor:
        if self.matcher.is_stopped() or self.matcher.is_error():
            return self.compiler.stop_mask
        allowed = torch.frombuffer(bytearray(self.matcher.compute_logit_bias()), dtype=torch.uint8)
        return allowed[: self.compiler.vocab_size] > 0
