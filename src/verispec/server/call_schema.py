"""Whether a call's arguments are what its tool takes. A call read under tool_choice auto is a call only where they
are (else it stays text, as written); arguments are always sent as JSON.

    read_json(text)          the value of a JSON text read strictly: RFC 8259 JSON (NaN, Infinity and -Infinity are
                             not JSON) whose every number is a finite double (1e999 and 400-digit integers are not);
                             ValueError otherwise
    validates(value, schema) whether a value is valid against a tool's schema as the grammar takes it

The schema is read as llguidance reads it when it builds the calls' grammar (tools.tool_grammar), so what the
grammar lets the model write inside the template's tags validates, and what it would not let through does not:
type, enum, const, properties, required, additionalProperties, patternProperties, min/maxProperties, items (a
schema, or a list of them with additionalItems), prefixItems, min/maxItems, min/maxLength, minimum, maximum,
exclusiveMinimum/Maximum (numbers, or draft 4's booleans), multipleOf, allOf, anyOf, oneOf (read as anyOf, as the
grammar reads it), and $ref to the schema's own places (`#`, JSON pointers such as `#/$defs/User`, $anchor names).
A keyword the grammar library refuses never gets here: the request that sent it was refused (a 400 naming `tools`).

A string's pattern and format (and an object key's patternProperties) are checked by llguidance itself, on the
string's JSON text one byte at a time: the regex semantics are the grammar's, and the cost is bounded by its lexer's
fuel whatever the pattern (a pattern that exhausts it does not match). The walk over the schema is bounded too: at
most MAX_STEPS checks, MAX_DEPTH levels of values and references; past either, the value does not validate.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal, InvalidOperation
from functools import cache, lru_cache
from typing import Any
from urllib.parse import unquote

MAX_STEPS = 100_000  # schema nodes visited for one value (anyOf over $refs can branch exponentially)
MAX_DEPTH = 128  # values nested in values, and references followed, on one path


# ---- strict JSON --------------------------------------------------------------------------------------------------
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of a double's range")
    return value


def _finite_int(text: str) -> int:
    value = int(text)  # more than 4,300 digits: ValueError
    try:
        float(value)
    except OverflowError:
        raise ValueError(f"{text[:40]}... is out of a double's range") from None
    return value


STRICT = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, parse_int=_finite_int)


def read_json(text: str) -> Any:
    """The value of a whole JSON text, read strictly (see the module's docstring); ValueError otherwise."""
    try:
        value, end = STRICT.raw_decode(text, len(text) - len(text.lstrip()))
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    if text[end:].strip():
        raise ValueError("text after the JSON value")
    return value


# ---- the schema ---------------------------------------------------------------------------------------------------
class _TooCostly(Exception):
    """The walk went past MAX_STEPS or MAX_DEPTH."""


def validates(value: Any, schema: Any) -> bool:
    """Whether `value` is valid against `schema` (None or {}: anything; see the module's docstring)."""
    try:
        return _Walk(schema).valid(value, schema, 0)
    except _TooCostly:
        return False


class _Walk:
    def __init__(self, root: Any):
        self.root, self.steps = root, 0

    def valid(self, value: Any, schema: Any, depth: int) -> bool:
        self.steps += 1
        if self.steps > MAX_STEPS or depth > MAX_DEPTH:
            raise _TooCostly
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            return True
        if "$ref" in schema:
            target = self.resolve(schema["$ref"])
            if target is None or not self.valid(value, target, depth + 1):
                return False
        if "const" in schema and not same(value, schema["const"]):
            return False
        if isinstance(schema.get("enum"), list) and not any(same(value, option) for option in schema["enum"]):
            return False
        if "type" in schema and not _typed(value, schema["type"]):
            return False
        if not self._combined(value, schema, depth):
            return False
        if isinstance(value, dict):
            return self._object(value, schema, depth)
        if isinstance(value, list):
            return self._array(value, schema, depth)
        if isinstance(value, str):
            return _within(len(value), schema, "minLength", "maxLength") and _string_matches(value, schema)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _number(value, schema)
        return True

    def _combined(self, value: Any, schema: dict, depth: int) -> bool:
        parts = schema.get("allOf")
        if isinstance(parts, list) and not all(self.valid(value, part, depth + 1) for part in parts):
            return False
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options and not any(self.valid(value, o, depth + 1) for o in options):
                return False
        return True

    def _object(self, value: dict, schema: dict, depth: int) -> bool:
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        if any(key not in value for key in required):
            return False
        if not _within(len(value), schema, "minProperties", "maxProperties"):
            return False
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            matched = [sub for pattern, sub in patterns.items() if _string_matches(key, {"pattern": pattern})]
            if key in properties:
                matched.append(properties[key])
            if not matched:
                matched.append(extra)
            if not all(self.valid(item, sub, depth + 1) for sub in matched):
                return False
        return True

    def _array(self, value: list, schema: dict, depth: int) -> bool:
        if not _within(len(value), schema, "minItems", "maxItems"):
            return False
        items = schema.get("items", True)
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # draft 4's tuple: these first, then additionalItems
            prefix, items = items, schema.get("additionalItems", True)
        prefix = prefix if isinstance(prefix, list) else []
        return all(self.valid(item, prefix[i] if i < len(prefix) else items, depth + 1) for i, item in enumerate(value))

    def resolve(self, reference: Any) -> Any:
        """The schema a $ref names within the tool's own schema (None: nowhere in it)."""
        if not isinstance(reference, str):
            return None
        base = self.root.get("$id") if isinstance(self.root, dict) else None
        if isinstance(base, str) and reference.startswith(base):
            reference = reference[len(base) :]
        if not reference.startswith("#"):
            return None
        fragment = unquote(reference[1:])
        if fragment and not fragment.startswith("/"):
            return _anchor(self.root, fragment)
        node = self.root
        for token in fragment.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return node


def _anchor(root: Any, name: str) -> Any:
    """The subschema whose $anchor is `name` (searched without recursion)."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("$anchor") == name:
                return node
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
    return None


def same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0, objects and arrays compared member by member."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _typed(value: Any, kind: Any) -> bool:
    kinds = kind if isinstance(kind, list) else [kind]
    checks = {
        "object": isinstance(value, dict), "array": isinstance(value, list), "string": isinstance(value, str),
        "boolean": isinstance(value, bool), "null": value is None,
        "integer": isinstance(value, int) and not isinstance(value, bool)
        or isinstance(value, float) and value.is_integer(),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
    }  # fmt: skip
    return any(checks.get(k, False) for k in kinds)


def _within(size: float, schema: dict, low: str, high: str) -> bool:
    lowest, highest = schema.get(low), schema.get(high)
    if _numeric(lowest) and size < lowest:
        return False
    return not (_numeric(highest) and size > highest)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: float, schema: dict) -> bool:
    if not _within(value, schema, "minimum", "maximum"):
        return False
    low, high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low is True:  # draft 4: the minimum itself is out
        low = schema.get("minimum")
    if high is True:
        high = schema.get("maximum")
    if _numeric(low) and value <= low or _numeric(high) and value >= high:
        return False
    step = schema.get("multipleOf")
    return not _numeric(step) or step <= 0 or _multiple(value, step)


def _multiple(value: float, step: float) -> bool:
    if isinstance(value, int) and isinstance(step, int):
        return value % step == 0
    try:  # in decimal: 0.3 is a multiple of 0.1
        return Decimal(repr(value)) % Decimal(repr(step)) == 0
    except InvalidOperation:  # a quotient past the context's precision: too far apart to tell
        return False


# ---- strings, through the grammar library --------------------------------------------------------------------------
def _string_matches(text: str, schema: dict) -> bool:
    """Whether a string meets its schema's pattern (searched for, as JSON Schema says) and format, as the grammar
    takes them: llguidance's own reading of the string's JSON text."""
    check = {key: schema[key] for key in ("pattern", "format") if isinstance(schema.get(key), str)}
    if not check:
        return True
    from llguidance import LLMatcher

    data = json.dumps(text, ensure_ascii=False).encode()
    matcher = LLMatcher(_bytes_tokenizer(), _string_grammar(json.dumps(check)), log_level=0, limits=_limits())
    return matcher.try_consume_tokens(list(data)) == len(data) and matcher.is_accepting() and not matcher.is_error()


@lru_cache(maxsize=256)
def _string_grammar(check: str) -> str:
    from llguidance import grammar_from

    return grammar_from("json_schema", json.dumps({"type": "string", **json.loads(check)}))


@cache
def _limits():
    from ..decoding.grammar import parser_limits

    return parser_limits()


@cache
def _bytes_tokenizer():
    """A tokenizer whose tokens are the 256 bytes (and an end token): the grammar library reads text byte by byte."""
    from llguidance import LLTokenizer, TokenizerWrapper

    class Bytes:
        eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
        tokens = [bytes([i]) for i in range(256)] + [b""]

        def __call__(self, text: bytes) -> list[int]:
            return list(text)

    return LLTokenizer(TokenizerWrapper(Bytes()), slices=[])
