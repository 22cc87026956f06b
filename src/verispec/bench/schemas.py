"""The `json-schema` bench dataset: twenty small JSON schemas, each with the topic of its prompt ("<topic>, as
JSON."), for structured-output runs (tokens/s with speculation on and off under a schema) and tests.

Every object is closed to other properties (`additionalProperties: false`, as OpenAI's strict mode asks of
schemas): an open object lets a model add properties until it runs out of tokens. Integers that a greedy model
could write forever are bounded.
"""

from __future__ import annotations

from typing import Any


def closed(schema: Any) -> Any:
    """The schema with every object closed to properties it does not name."""
    if isinstance(schema, dict):
        schema = {key: closed(value) for key, value in schema.items()}
        if schema.get("type") == "object":
            schema.setdefault("additionalProperties", False)
    return schema


_OPEN = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"]}, "A person"),
    ({"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
      "required": ["city", "country"]}, "The capital of France"),
    ({"type": "object", "properties": {"language": {"enum": ["python", "rust", "go"]}, "reason": {"type": "string",
      "maxLength": 40}}, "required": ["language", "reason"]}, "The best language for scripts"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 5}, "The first primes"),
    ({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}, "Is 7 prime?"),
    ({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]},
     "A point on the unit circle"),
    ({"type": "object", "properties": {"function": {"type": "string", "pattern": "^[a-z_]+$"},
      "args": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}, "required": ["function", "args"]},
     "A Python call that sorts a list"),
    ({"type": "string", "enum": ["red", "green", "blue"]}, "The colour of the sky"),
    ({"type": "object", "properties": {"title": {"type": "string", "maxLength": 30}, "year": {"type": "integer",
      "minimum": 1900, "maximum": 2030}}, "required": ["title", "year"]}, "A famous film"),
    ({"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer"},
      "email": {"type": "string", "maxLength": 30}}, "required": ["id", "email"]}}, "required": ["user"]},
     "A user record"),
    ({"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4},
     "Some fruits"),
    ({"type": "object", "properties": {"celsius": {"type": "number"}, "fahrenheit": {"type": "number"}},
      "required": ["celsius", "fahrenheit"]}, "Water's boiling point"),
    ({"type": "object", "properties": {"status": {"enum": ["open", "closed"]}, "count": {"type": "integer",
      "minimum": 0, "maximum": 999}}, "required": ["status", "count"]}, "An issue tracker summary"),
    ({"type": "integer", "minimum": 1, "maximum": 100}, "A number between 1 and 100"),
    ({"type": "object", "properties": {"keys": {"type": "array", "items": {"type": "string", "maxLength": 10},
      "maxItems": 3}}, "required": ["keys"]}, "The keys of a Python dict of settings"),
    ({"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}, "2 + 3"),
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "tags": {"type": "array",
      "items": {"enum": ["fast", "safe", "simple"]}, "maxItems": 3}}, "required": ["name", "tags"]},
     "A programming language"),
    ({"type": "boolean"}, "Is the earth flat?"),
    ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"type": ["integer", "null"]}},
      "required": ["a", "b"]}, "Two fields"),
    ({"type": "object", "properties": {"host": {"type": "string", "maxLength": 20}, "port": {"type": "integer",
      "minimum": 1, "maximum": 65535}}, "required": ["host", "port"]}, "A web server address"),
]  # fmt: skip

SCHEMAS: list[tuple[str, dict]] = [(topic, closed(schema)) for schema, topic in _OPEN]  # (topic, schema)
