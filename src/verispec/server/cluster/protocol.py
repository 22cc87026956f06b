"""What the ingress sends an engine replica: one HTTP request, read whole (bodies are at most
--max-body-bytes), and the keys it is routed by."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    client: tuple[str, int] | None = None
    prefix: tuple[int, ...] = ()  # prefix.prefix_keys of the body
