"""The keys a request is routed by: chained hashes of its prompt text in fixed blocks.

Block i's key hashes blocks 0..i, so one key names one whole prefix: two requests share key i exactly when
their first i + 1 blocks are equal. Only whole blocks count (a prompt shorter than one block has no key). The
text is the prompt as the client wrote it (a chat's roles and contents), not tokens: the ingress holds no
tokenizer, and equal text gives equal tokens, which is all the engine's prefill reuse needs.
"""

from __future__ import annotations

import hashlib
import json

BLOCK_CHARS = 256  # about 64-80 tokens of English or code: half a default prefill chunk (128 tokens)
MAX_BLOCKS = 64  # keys for the first 16 KiB of a prompt; a longer shared beginning is rare and costs hashing


def prefix_keys(path: str, body: bytes) -> tuple[int, ...]:
    """The request's prefix keys, shortest prefix first; () when the body is not a request we can read (the
    replica answers it with the error it deserves)."""
    text = _prompt_text(path, body)
    if text is None:
        return ()
    keys, state = [], b""
    for start in range(0, min(len(text), BLOCK_CHARS * MAX_BLOCKS) - BLOCK_CHARS + 1, BLOCK_CHARS):
        state = hashlib.blake2b(state + text[start : start + BLOCK_CHARS].encode(), digest_size=8).digest()
        keys.append(int.from_bytes(state, "little"))
    return tuple(keys)


def _prompt_text(path: str, body: bytes) -> str | None:
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(request, dict):
        return None
    if path.rstrip("/") == "/v1/completions":
        return _completion_text(request.get("prompt"))
    if path.rstrip("/") == "/v1/chat/completions":
        return _chat_text(request.get("messages"))
    return None


def _completion_text(prompt) -> str | None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return "".join(f"{t}," for t in prompt)  # token ids: their digits keep the blocks' prefix order
    return None


def _chat_text(messages) -> str | None:
    if not isinstance(messages, list):
        return None
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        if isinstance(content, list):  # content parts: their texts, as the server joins them
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role')}\x00{content if isinstance(content, str) else ''}\x01")
    return "".join(parts)
