"""Which requests may draft from each other's outputs and reuse each other's prefilled prompts (--cache-sharing).

Sharing is what makes an agent fast: its next request copies what the last one wrote, and prefills only what is
new. Between tenants it leaks: a request answered in a fraction of the time, or whose `verispec` stats count
accepted lookups, tells that someone else was given that answer or sent that prompt. So the server puts each
request in a partition, and the engine shares only within one (EngineRequest.partition):

    global   every request together (one user, or users who trust each other)
    key      requests sent with the same API key (the default: each of several --api-key a tenant of its own;
             a server with one key or none is one tenant)
    user     requests with the same key and the same OpenAI `user` field; a request without one shares nothing
    none     nothing: each request drafts from its own context and reuses no other prompt

A request's `cache_salt` (vLLM's field) narrows it further in every mode: only requests with the same salt share.
"""

from __future__ import annotations

import json

from ..engine.requests import PRIVATE

SHARING = ("global", "key", "user", "none")


def partition_of(sharing: str, key: int | None, user: str | None, salt: str | None, request_id: str) -> str:
    """The partition of a request sent with API key number `key` (None: no key), `user` and `cache_salt` `salt`;
    `request_id` names one of its own (all of a request's `n` choices share it)."""
    if sharing == "global":
        owner: list = ["all"]
    elif sharing == "key":
        owner = ["key", key]
    elif sharing == "user" and user is not None:
        owner = ["key", key, "user", user]
    else:  # none, or user without a user: the request's own, which no later request can read
        return PRIVATE + json.dumps([request_id, salt])
    return json.dumps([*owner, salt])  # unambiguous: no user or salt can spell another's partition


def tenant_of(key: int | None) -> str:
    """Who a request is served fairly as (engine/admission.py): its API key. Its `user` field (an application serving
    many people through one key names them there) is the member within that tenant (EngineRequest.member): it divides
    the key's share and never adds to it, or a client naming a new user per request would take every slot."""
    return json.dumps(["key", key])


def store_scope(sharing: str, key: int | None) -> str:
    """Whose stored responses a request reads and writes (server/responses_store.py): everyone's under global sharing;
    else its API key's (a response is read back by id, which carries no `user`). Another scope asking for a
    response's id gets the 404 an unknown id gets."""
    return json.dumps(["all"] if sharing == "global" else ["key", key])
