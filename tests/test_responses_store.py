"""The Responses API's store (server/responses_store.py): eviction charged to the scope that causes it (one tenant's
flood never takes another's responses within its fair share), expiry of responses and of their items alike, items
kept while any response holds them, a file of the first schema opened and migrated; and through the API, on the tiny
pair: a call cut by max_output_tokens chained as an incomplete call, expired and deleted items 404 everywhere, shared
item ids surviving a delete."""

from __future__ import annotations

import json
import sqlite3

import pytest

from verispec.server.responses_store import ResponseStore, StoredResponse, StoreLimits

DAY = 86400.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _response(response_id: str, size: int = 0, items: tuple[str, ...] = ()) -> StoredResponse:
    output = [{"type": "message", "id": item, "role": "assistant", "content": "x" * size} for item in items]
    if size and not items:
        output = [{"type": "message", "id": f"msg_{response_id}", "role": "assistant", "content": "x" * size}]
    return StoredResponse(response_id, {"id": response_id, "output": output}, [], output)


# ---- eviction --------------------------------------------------------------------------------------------------
def test_a_flood_of_small_responses_evicts_the_flooders_own_not_another_scopes():
    """`--responses-store-limits 20,1MiB,30`: B stores 5 responses of ~60 KB, then A stores 30 one-token ones. B held
    the most bytes, so the old rule (the scope holding the most bytes goes first) emptied B."""
    store = ResponseStore(limits=StoreLimits(20, 2**20, 30 * DAY))
    for i in range(5):
        store.put("B", _response(f"b{i}", size=60_000))
    for i in range(30):
        store.put("A", _response(f"a{i}", size=10))
    assert all(store.get("B", f"b{i}") is not None for i in range(5))
    assert store.count() == 20 and store.usage("A")[0] == 15  # A uses what B leaves of the count, no more
    assert store.get("A", "a0") is None and store.get("A", "a29") is not None  # A's own oldest went


def test_a_flood_of_large_responses_evicts_the_flooders_own_bytes():
    store = ResponseStore(limits=StoreLimits(1000, 1_000_000, 30 * DAY))
    for i in range(20):
        store.put("B", _response(f"b{i}", size=1_000))
    for i in range(40):
        store.put("A", _response(f"a{i}", size=100_000))
    assert all(store.get("B", f"b{i}") is not None for i in range(20))
    assert store.usage("A")[1] + store.usage("B")[1] <= 1_000_000


def test_a_scope_beyond_its_fair_share_gives_back_only_what_is_beyond_it():
    """B filled the store while alone (16 of 20); A then writes: B gives up its oldest down to its share (10), and
    from there A's writes evict A's own."""
    store = ResponseStore(limits=StoreLimits(20, 2**30, 30 * DAY))
    for i in range(16):
        store.put("B", _response(f"b{i}"))
    for i in range(30):
        store.put("A", _response(f"a{i}"))
    assert store.usage("B")[0] == 10 and store.usage("A")[0] == 10
    assert store.get("B", "b5") is None and store.get("B", "b6") is not None


def test_bounds_hold_and_survive_a_restart(tmp_path):
    store = ResponseStore(tmp_path / "responses.sqlite", StoreLimits(max_count=5))
    store.put("quiet", _response("q"))
    for i in range(20):
        store.put("flood", _response(f"f{i}"))
    assert store.count() == 5 and store.get("quiet", "q") is not None and store.get("flood", "f0") is None
    store.close()
    assert ResponseStore(tmp_path / "responses.sqlite").get("quiet", "q") is not None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0, -1])
def test_limits_are_finite_and_positive(bad):
    for field in ("max_count", "max_bytes", "max_age"):
        with pytest.raises(ValueError, match=field):
            StoreLimits(**{field: bad})


# ---- expiry and items ----------------------------------------------------------------------------------------------
def test_a_response_past_its_age_and_its_items_are_gone_before_any_write():
    clock = Clock()
    store = ResponseStore(limits=StoreLimits(max_age=DAY), clock=clock)
    store.put("A", _response("r1", items=("msg_1",)))
    assert store.item("A", "msg_1") is not None and store.get("A", "r1") is not None
    clock.now += DAY + 1
    assert store.get("A", "r1") is None and store.item("A", "msg_1") is None
    assert not store.delete("A", "r1")


def test_an_item_is_kept_while_any_response_holds_it():
    store = ResponseStore()
    store.put("A", _response("r1", items=("msg_shared",)))
    store.put("A", _response("r2", items=("msg_shared", "msg_own")))
    assert store.delete("A", "r1") and store.item("A", "msg_shared") is not None
    assert store.item("B", "msg_shared") is None  # never another scope's
    assert store.delete("A", "r2") and store.item("A", "msg_shared") is None and store.item("A", "msg_own") is None


FIRST_SCHEMA = """
CREATE TABLE responses (id TEXT PRIMARY KEY, scope TEXT NOT NULL, created REAL NOT NULL, bytes INTEGER NOT NULL,
    response TEXT NOT NULL, input_items TEXT NOT NULL, conversation TEXT NOT NULL);
CREATE INDEX responses_by_scope ON responses (scope, created);
CREATE INDEX responses_by_age ON responses (created);
CREATE TABLE items (id TEXT NOT NULL, scope TEXT NOT NULL, response_id TEXT NOT NULL, item TEXT NOT NULL,
    PRIMARY KEY (scope, id));
CREATE INDEX items_by_response ON items (response_id);
"""


def test_a_file_of_the_first_schema_opens_and_keeps_its_items(tmp_path):
    """Items once had one owner each (PRIMARY KEY (scope, id)): such a file is migrated when opened, its responses
    and items read as before, and from then on items are held per response."""
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(FIRST_SCHEMA)
    item = {"type": "message", "id": "msg_old", "role": "user", "content": "hi"}
    old = {"id": "r_old", "output": []}
    db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
               ("r_old", "A", Clock().now, 10, json.dumps(old), json.dumps([item]), json.dumps([item])))  # fmt: skip
    db.execute("INSERT INTO items VALUES (?, ?, ?, ?)", ("msg_old", "A", "r_old", json.dumps(item)))
    db.commit()
    db.close()
    store = ResponseStore(path, clock=Clock())
    assert store.get("A", "r_old").input_items == [item] and store.item("A", "msg_old") == item
    store.put("A", StoredResponse("r_new", {"id": "r_new", "output": []}, [item], [item]))
    assert store.delete("A", "r_old") and store.item("A", "msg_old") == item  # r_new holds it too
    store.close()
    again = ResponseStore(path, clock=Clock())  # migrated once: opens as it is
    assert again.item("A", "msg_old") == item and again.get("A", "r_new") is not None


# ---- through the API -----------------------------------------------------------------------------------------------
WEATHER = {"type": "function", "name": "get_weather", "description": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def client(one_thread, clock):
    from fastapi.testclient import TestClient

    from verispec.engine.scheduler import Scheduler, SchedulerConfig
    from verispec.server.app import ServerState, create_app
    from verispec.testing import tiny_loaded, tiny_pair, tool_tokenizer

    target, draft = tiny_pair()
    tokenizer = tool_tokenizer()
    target, draft = tiny_loaded(target.model, tokenizer), tiny_loaded(draft.model, tokenizer, "tiny-draft")
    scheduler = Scheduler(target, draft, SchedulerConfig(max_num_seqs=2, max_queue=8, max_model_len=512))
    store = ResponseStore(limits=StoreLimits(max_age=DAY), clock=clock)
    app = create_app(ServerState(scheduler, "tiny", api_keys=("key-a", "key-b"), responses=store))
    with TestClient(app, headers={"Authorization": "Bearer key-a"}) as client:
        yield client


def test_a_call_cut_by_max_output_tokens_is_chained_as_an_incomplete_call(client):
    """The cut call's stored arguments (`{"city": "...` cut) once made every continuation a 400: it is shown to the
    model closed as far as it was written, and its result may be sent back."""
    body = {"input": "weather", "tools": [WEATHER], "tool_choice": "required", "max_output_tokens": 100,
            "temperature": 0}  # fmt: skip
    first = client.post("/v1/responses", json=body).json()
    call = first["output"][0]
    assert first["status"] == "incomplete" and call["type"] == "function_call" and call["status"] == "incomplete"
    with pytest.raises(ValueError):
        json.loads(call["arguments"])  # cut: not JSON as written
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    chained = client.post("/v1/responses", json={"input": [answer], "previous_response_id": first["id"],
                                                  "tools": [WEATHER], "max_output_tokens": 4})  # fmt: skip
    assert chained.status_code == 200, chained.text
    referenced = client.post("/v1/responses", json={"input": [{"role": "user", "content": "weather"},
                                                              {"type": "item_reference", "id": call["id"]}, answer],
                                                    "tools": [WEATHER], "max_output_tokens": 4})  # fmt: skip
    assert referenced.status_code == 200, referenced.text
    resent = {"input": [{"role": "user", "content": "weather"}, call, answer], "tools": [WEATHER],
              "max_output_tokens": 4, "store": False}  # fmt: skip
    resent = client.post("/v1/responses", json=resent)
    assert resent.status_code == 200, resent.text  # what a client without the store (Codex) sends back


def test_a_cut_custom_or_shell_call_reads_its_input_as_far_as_it_was_written():
    """A cut custom tool call's input was the raw JSON of its arguments (`{"input": "ls -`)."""
    from verispec.server.cut_json import closed_object
    from verispec.server.responses_api import _call_item

    kinds = {"run": "custom", "local_shell": "local_shell"}
    assert _call_item("c1", "run", '{"input": "ls -', kinds, "incomplete")["input"] == "ls -"
    assert _call_item("c2", "run", '{"inp', kinds, "incomplete")["input"] == ""
    shell = _call_item("c3", "local_shell", '{"command": ["ls", "-l', kinds, "incomplete")
    assert shell["action"] == {"type": "exec", "command": ["ls", "-l"]}
    cases = {
        '{"path": "/': {"path": "/"},
        '{"a": 12.': {"a": 12},
        '{"a": tr': {},
        '{"a": [1, {"b": "x\\u00': {"a": [1, {"b": "x"}]},
        '{"q": "a\\"b': {"q": 'a"b'},
        "[1, 2": {},
        "": {},
        '{"a": 1, "b": NaN': {"a": 1},
    }
    for text, closed in cases.items():
        assert closed_object(text) == closed, text
    assert closed_object('{"a": "' + "x" * 200_000) == {"a": "x" * 200_000}


def test_expired_and_deleted_items_are_404_everywhere_and_shared_ids_survive(client, clock):
    shared = {"type": "message", "id": "msg_shared", "role": "user", "content": "hi"}
    first = client.post("/v1/responses", json={"input": [shared], "max_output_tokens": 2}).json()
    second = client.post("/v1/responses", json={"input": [shared], "max_output_tokens": 2}).json()
    reference = {"input": [{"type": "item_reference", "id": "msg_shared"}], "max_output_tokens": 2, "store": False}
    assert client.delete(f"/v1/responses/{first['id']}").status_code == 200
    assert client.post("/v1/responses", json=reference).status_code == 200  # the second still holds it
    other = client.post("/v1/responses", json=reference, headers={"Authorization": "Bearer key-b"})
    assert other.status_code == 404 and other.json()["error"]["param"] == "input.0.id"
    output_item = second["output"][0]["id"]
    clock.now += DAY + 1  # past max_age, before any write
    assert client.get(f"/v1/responses/{second['id']}").status_code == 404
    follow = client.post("/v1/responses", json={"input": "x", "previous_response_id": second["id"]})
    assert follow.status_code == 404
    for item_id in ("msg_shared", output_item):
        expired = client.post("/v1/responses", json={**reference, "input": [{"type": "item_reference", "id": item_id}]})
        assert expired.status_code == 404 and expired.json()["error"]["param"] == "input.0.id", item_id


def test_echoed_fields_are_bounded_and_counted_in_the_stores_bytes(client):
    """A 1 MB `reasoning.context` was accepted, echoed and stored; the fields the model never reads are bounded,
    and what a response echoes counts against the store's bytes."""
    refused = client.post("/v1/responses", json={"input": "x", "reasoning": {"context": "c" * 2**20}})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "reasoning.context"
    store = client.app.state.verispec.responses
    before = store.count()
    kept = client.post("/v1/responses", json={"input": "x", "max_output_tokens": 2,
                                              "reasoning": {"effort": "low", "context": "c" * 200}})  # fmt: skip
    assert kept.status_code == 200 and kept.json()["reasoning"]["context"] == "c" * 200 and store.count() == before + 1
    scope = json.dumps(["key", 0])
    assert store.usage(scope)[1] >= len(json.dumps(kept.json()))
