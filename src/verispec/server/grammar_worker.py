"""A worker process that checks new grammars for the server: `python grammar_worker.py` (run by its path, so it
imports only the standard library and llguidance, not verispec or torch).

The grammar library compiles by recursion on a native stack; a grammar whose rules chain deeply enough
overflows it and kills the process. Here that kills only this worker: the server answers 400 and starts
another (server/grammars.py). Each check builds the grammar's text, validates it, starts a matcher and
computes its first mask, on a thread of the stack size the server asks for (8 MiB: the server compiles on
GRAMMAR_STACK_BYTES, eight times that, so what passes here cannot overflow there).

Protocol, one JSON object per line: the server first sends {"tokenizer": tokenizer.json text, "n_vocab",
"eos": [ids], "stack_bytes"}, answered {"ready": true}; then each {"kind", "value"} is answered
{"source": grammar text} or {"error": the library's message}.
"""

from __future__ import annotations

import json
import sys
import threading
from functools import partial


def check(tokenizer, kind: str, value: str) -> dict:
    from llguidance import LLMatcher, LLParserLimits, grammar_from

    try:  # kind and value as GrammarSpec.library_input gives them (json_object already a schema)
        source = grammar_from(kind, value)
    except Exception as exc:  # noqa: BLE001 - its parsers raise several types for a bad grammar text
        return {"error": str(exc)}
    limits = LLParserLimits(verbose_errors=False)
    failed, messages = LLMatcher.validate_grammar_with_warnings(source, tokenizer, limits=limits)
    if failed:
        return {"error": messages[0]}
    matcher = LLMatcher(tokenizer, source, log_level=0, limits=limits)
    if not matcher.is_error():
        matcher.compute_logit_bias()
    if matcher.is_error():
        return {"error": matcher.get_error()}
    return {"source": source}


def on_thread(stack_bytes: int, function):
    """`function()` on a thread with a stack of `stack_bytes`."""
    result: list = []
    threading.stack_size(stack_bytes)
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    thread.join()
    return result[0]


def main() -> None:
    from llguidance import LLTokenizer

    setup = json.loads(sys.stdin.readline())
    tokenizer = LLTokenizer(setup["tokenizer"], n_vocab=setup["n_vocab"], eos_token=setup["eos"])
    stack_bytes = setup["stack_bytes"]
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        answer = on_thread(stack_bytes, partial(check, tokenizer, job["kind"], job["value"]))
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
