"""Stored responses of the Responses API (`store: true`, OpenAI's default): each response with its input items and
the conversation it continued, so that `previous_response_id` continues from it and `GET /v1/responses/{id}` (and
`.../input_items`, `DELETE`) read it back.

Where: an SQLite file (`--responses-store PATH`: responses survive a restart) or an SQLite database in memory (the
default). Bounds (`--responses-store-limits`): at most `max_count` responses and `max_bytes` bytes of them in all, each
kept at most `max_age` seconds (OpenAI keeps 30 days). Past a bound, the oldest response of the scope holding the most
bytes goes first, so one tenant's flood evicts its own responses before another's.

Scope: a response is read back only in the scope that stored it (server/partitions.py `store_scope`: the API key;
everyone under --cache-sharing global); another scope asking for its id gets the 404 an unknown id gets.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MAX_COUNT = 10_000
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MAX_AGE = 30 * 24 * 3600.0


@dataclass(frozen=True)
class StoreLimits:
    max_count: int = DEFAULT_MAX_COUNT
    max_bytes: int = DEFAULT_MAX_BYTES
    max_age: float = DEFAULT_MAX_AGE


@dataclass(frozen=True)
class StoredResponse:
    id: str
    response: dict[str, Any]  # the Response object as answered
    input_items: list[dict[str, Any]]  # the request's input items (with ids), in order
    conversation: list[dict[str, Any]]  # every item the response saw and wrote: what a continuation starts from


_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    created REAL NOT NULL,
    bytes INTEGER NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    conversation TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_scope ON responses (scope, created);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created);
CREATE TABLE IF NOT EXISTS items (
    id TEXT NOT NULL,
    scope TEXT NOT NULL,
    response_id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS items_by_response ON items (response_id);
"""


class ResponseStore:
    """Stored responses, thread-safe (the server's handlers and worker threads share one)."""

    def __init__(self, path: str | Path | None = None, limits: StoreLimits | None = None):
        self.path = str(path) if path is not None else ":memory:"
        self.limits = limits or StoreLimits()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def put(self, scope: str, stored: StoredResponse) -> None:
        texts = [json.dumps(part, ensure_ascii=False) for part in
                 (stored.response, stored.input_items, stored.conversation)]  # fmt: skip
        size = sum(len(text.encode()) for text in texts)
        items = [item for item in [*stored.input_items, *stored.response.get("output", [])] if item.get("id")]
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                (stored.id, scope, time.time(), size, *texts),
            )
            self._db.executemany(
                "INSERT OR IGNORE INTO items VALUES (?, ?, ?, ?)",  # an item referenced again keeps its first owner
                [(str(item["id"]), scope, stored.id, json.dumps(item, ensure_ascii=False)) for item in items],
            )
            self._bound()

    def item(self, scope: str, item_id: str) -> dict[str, Any] | None:
        """An input or output item of a stored response of `scope`, by its id (an `item_reference`)."""
        with self._lock:
            row = self._db.execute("SELECT item FROM items WHERE scope = ? AND id = ?", (scope, item_id)).fetchone()
        return None if row is None else json.loads(row[0])

    def get(self, scope: str, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT response, input_items, conversation, created FROM responses WHERE id = ? AND scope = ?",
                (response_id, scope),
            ).fetchone()
        if row is None or time.time() - row[3] > self.limits.max_age:
            return None
        return StoredResponse(response_id, *(json.loads(text) for text in row[:3]))

    def delete(self, scope: str, response_id: str) -> bool:
        with self._lock:
            cursor = self._db.execute("DELETE FROM responses WHERE id = ? AND scope = ?", (response_id, scope))
            self._db.execute("DELETE FROM items WHERE response_id = ? AND scope = ?", (response_id, scope))
        return cursor.rowcount > 0

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _bound(self) -> None:
        """Drop what is too old, then, while over a bound, the oldest response of the scope holding the most bytes."""
        db, limits = self._db, self.limits
        evicted = db.execute("DELETE FROM responses WHERE created < ?", (time.time() - limits.max_age,)).rowcount
        while True:
            count, size = db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses").fetchone()
            if count <= limits.max_count and size <= limits.max_bytes:
                if evicted:
                    db.execute("DELETE FROM items WHERE response_id NOT IN (SELECT id FROM responses)")
                return
            evicted += 1
            scope = db.execute(
                "SELECT scope FROM responses GROUP BY scope ORDER BY SUM(bytes) DESC LIMIT 1"
            ).fetchone()[0]
            db.execute(
                "DELETE FROM responses WHERE id = (SELECT id FROM responses WHERE scope = ? ORDER BY created LIMIT 1)",
                (scope,),
            )
