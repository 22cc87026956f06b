"""The structured-output bench datasets, each schema with the topic of its prompt ("<topic>, as JSON."):

    json-schema        twenty small schemas (answers of about 17 tokens: prefill and the draft's catch-up weigh)
    json-schema-long   ten lists of eight records (answers of about 180 tokens: decoding under the grammar)

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


def _list_of(count: int, **fields: dict) -> dict:
    item = {"type": "object", "properties": fields, "required": list(fields)}
    return closed({"type": "array", "items": item, "minItems": count, "maxItems": count})


def _text(length: int) -> dict:
    return {"type": "string", "maxLength": length}


def _int(low: int, high: int) -> dict:
    return {"type": "integer", "minimum": low, "maximum": high}


LONG_SCHEMAS: list[tuple[str, dict]] = [
    ("List 8 programming languages with the year each appeared", _list_of(8, name=_text(20), year=_int(1950, 2025))),
    ("List 8 countries with their capitals", _list_of(8, country=_text(20), capital=_text(20))),
    ("List 8 chemical elements with their symbols and atomic numbers",
     _list_of(8, element=_text(15), symbol=_text(3), number=_int(1, 118))),
    ("List 8 Python built-in functions with a short description",
     _list_of(8, function=_text(15), description=_text(40))),
    ("List 8 planets and moons with their diameters in km", _list_of(8, body=_text(15), diameter_km=_int(1, 200000))),
    ("List 8 HTTP status codes with their meanings", _list_of(8, code=_int(100, 599), meaning=_text(30))),
    ("List 8 sorting algorithms with their average time complexity",
     _list_of(8, algorithm=_text(20), complexity=_text(12))),
    ("List 8 famous scientists with their field", _list_of(8, name=_text(25), field=_text(20))),
    ("List 8 Linux commands with what they do", _list_of(8, command=_text(10), purpose=_text(40))),
    ("List 8 fruits with their colour", _list_of(8, fruit=_text(15), colour=_text(12))),
]  # fmt: skip
