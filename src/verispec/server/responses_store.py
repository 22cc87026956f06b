"""Stored responses of the Responses API (`store: true`, OpenAI's default): each response with its input items and
the conversation it continued, so that `previous_response_id` continues from it and `GET /v1/responses/{id}` (and
`.../input_items`, `DELETE`) read it back, and its items can be named by `item_reference`.

Where: an SQLite file (`--responses-store PATH`: responses survive a restart) or an SQLite database in memory (the
default). A file written before items were kept per response (one owner per item id) is migrated when opened.

Scope: a response is read back only in the scope that stored it (server/partitions.py `store_scope`: the API key;
everyone under --cache-sharing global); another scope asking for its id gets the 404 an unknown id gets.

Items: a response holds its input and output items by their ids; an item is found (`item_reference`) while any live
response of its scope holds it: two responses sharing a client-chosen item id each hold it, and deleting one leaves
the other's. Where several hold one id, the oldest's copy is the one found.

Bounds (`--responses-store-limits`): at most `max_count` responses and `max_bytes` bytes of them in all (the bytes of
everything kept: the response as answered, with every field it echoes, its input items and its conversation), each
kept at most `max_age` seconds (OpenAI keeps 30 days). A response past `max_age` is gone everywhere at once: its id
and its items are 404 whether or not a write has removed it yet. Eviction is charged to the scope that causes it:
with S scopes holding responses, each scope's fair share is max_count / S responses and max_bytes / S bytes. A write
that takes the store over a bound evicts the writer's own oldest responses while the writer holds more than its
share; only then, the oldest of the scope holding the most (which, the store being over the bound, holds more than
its share). So a scope within its share loses nothing to another's flood, and a flooding scope evicts its own.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MAX_COUNT = 10_000
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MAX_AGE = 30 * 24 * 3600.0
SCHEMA_VERSION = 1  # 1: items keyed by (scope, id, response_id); 0: by (scope, id), one owner per item


@dataclass(frozen=True)
class StoreLimits:
    max_count: int = DEFAULT_MAX_COUNT
    max_bytes: int = DEFAULT_MAX_BYTES
    max_age: float = DEFAULT_MAX_AGE

    def __post_init__(self) -> None:
        for name in ("max_count", "max_bytes", "max_age"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"the store's {name} must be a finite number above 0, got {value}")


@dataclass(frozen=True)
class StoredResponse:
    id: str
    response: dict[str, Any]  # the Response object as answered
    input_items: list[dict[str, Any]]  # the request's input items (with ids), in order
    conversation: list[dict[str, Any]]  # every item the response saw and wrote: what a continuation starts from


_RESPONSES = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    created REAL NOT NULL,
    bytes INTEGER NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    conversation TEXT NOT NULL
)"""
# the columns in the order of the first schema: a server of the earlier version on the same file still writes them
_ITEMS = """CREATE TABLE IF NOT EXISTS {name} (
    id TEXT NOT NULL,
    scope TEXT NOT NULL,
    response_id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (scope, id, response_id)
)"""
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS responses_by_scope ON responses (scope, created)",
    "CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created)",
    "CREATE INDEX IF NOT EXISTS items_by_response ON items (response_id)",
)


class ResponseStore:
    """Stored responses, thread-safe (the server's handlers and worker threads share one). `clock`: the time in
    seconds (time.time; tests move it)."""

    def __init__(self, path: str | Path | None = None, limits: StoreLimits | None = None,
                 clock: Callable[[], float] = time.time):  # fmt: skip
        self.path = str(path) if path is not None else ":memory:"
        self.limits = limits or StoreLimits()
        self.clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        with self._lock, self._transaction():
            self._create_or_migrate()

    def put(self, scope: str, stored: StoredResponse) -> None:
        texts = [json.dumps(part, ensure_ascii=False) for part in
                 (stored.response, stored.input_items, stored.conversation)]  # fmt: skip
        size = sum(len(text.encode()) for text in texts)
        items = [item for item in [*stored.input_items, *stored.response.get("output", [])] if item.get("id")]
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                (stored.id, scope, self.clock(), size, *texts),
            )
            self._db.executemany(
                "INSERT OR IGNORE INTO items VALUES (?, ?, ?, ?)",  # an id twice in one response: its first copy
                [(str(item["id"]), scope, stored.id, json.dumps(item, ensure_ascii=False)) for item in items],
            )
            self._bound(scope)

    def item(self, scope: str, item_id: str) -> dict[str, Any] | None:
        """An input or output item of a live stored response of `scope`, by its id (an `item_reference`)."""
        with self._lock:
            row = self._db.execute(
                "SELECT items.item FROM items JOIN responses ON responses.id = items.response_id "
                "WHERE items.scope = ? AND items.id = ? AND responses.scope = ? AND responses.created >= ? "
                "ORDER BY responses.created LIMIT 1",
                (scope, item_id, scope, self._oldest_live()),
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def get(self, scope: str, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT response, input_items, conversation FROM responses WHERE id = ? AND scope = ? AND created >= ?",
                (response_id, scope, self._oldest_live()),
            ).fetchone()
        return None if row is None else StoredResponse(response_id, *(json.loads(text) for text in row))

    def delete(self, scope: str, response_id: str) -> bool:
        """Deletes a live response of `scope` and its hold on its items (another response's hold on them stays)."""
        with self._lock, self._transaction():
            cursor = self._db.execute(
                "DELETE FROM responses WHERE id = ? AND scope = ? AND created >= ?",
                (response_id, scope, self._oldest_live()),
            )
            self._db.execute("DELETE FROM items WHERE response_id = ? AND scope = ?", (response_id, scope))
        return cursor.rowcount > 0

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def usage(self, scope: str) -> tuple[int, int]:
        """(responses, bytes) `scope` holds."""
        with self._lock:
            return self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses WHERE scope = ?", (scope,)
            ).fetchone()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- internals (called with the lock held) --------------------------------------------------------------------
    def _oldest_live(self) -> float:
        return self.clock() - self.limits.max_age

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """A write transaction: the whole of a put and its evictions, or none of it (several processes may share
        one file: each sees the bounds as the last write left them)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _create_or_migrate(self) -> None:
        """The tables of SCHEMA_VERSION; an earlier file's items table rebuilt with its rows (each item held by the
        response that first stored it, as before)."""
        db = self._db
        db.execute(_RESPONSES)
        version = db.execute("PRAGMA user_version").fetchone()[0]
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'items'").fetchone()
        if version < SCHEMA_VERSION and exists:
            db.execute(_ITEMS.format(name="items_by_holder"))
            db.execute("INSERT OR IGNORE INTO items_by_holder SELECT id, scope, response_id, item FROM items")
            db.execute("DROP TABLE items")
            db.execute("ALTER TABLE items_by_holder RENAME TO items")
        db.execute(_ITEMS.format(name="items"))
        for index in _INDEXES:
            db.execute(index)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _bound(self, writer: str) -> None:
        """Drops what is past max_age, then, while over a bound, evicts by the fair rule (the module's docstring)."""
        db, limits = self._db, self.limits
        expired = db.execute("SELECT id FROM responses WHERE created < ?", (self._oldest_live(),)).fetchall()
        self._remove([response_id for (response_id,) in expired])
        for column, limit in (("1", limits.max_count), ("bytes", limits.max_bytes)):
            while True:
                held = dict(db.execute(f"SELECT scope, SUM({column}) FROM responses GROUP BY scope").fetchall())
                excess = sum(held.values()) - limit
                if excess <= 0:
                    break
                share = limit / len(held)
                victim = writer if held.get(writer, 0) > share else max(held, key=held.__getitem__)
                self._evict_oldest(victim, column, min(excess, held[victim] - share))

    def _evict_oldest(self, scope: str, column: str, amount: float) -> None:
        """Evicts `scope`'s oldest responses until `amount` of `column` (1: responses; bytes) is freed (>= 1 row)."""
        rows = self._db.execute(
            f"SELECT id, {column} FROM responses WHERE scope = ? ORDER BY created, rowid", (scope,)
        ).fetchall()
        freed, ids = 0, []
        for response_id, size in rows:
            ids.append(response_id)
            freed += size
            if freed >= amount:
                break
        self._remove(ids)

    def _remove(self, ids: list[str]) -> None:
        """Deletes these responses and their hold on their items."""
        self._db.executemany("DELETE FROM items WHERE response_id = ?", [(i,) for i in ids])
        self._db.executemany("DELETE FROM responses WHERE id = ?", [(i,) for i in ids])
