"""What the server reads and how long it waits: the defaults of its limit flags, and the fixed limits (each
answered with the status docs/server.md lists)."""

DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # --max-body-bytes: 413 beyond (a 4,096-token prompt is tens of kilobytes)
DEFAULT_GRAMMAR_TIMEOUT = 10.0  # --grammar-timeout: seconds a new grammar may take to be checked and compiled
MAX_JSON_DEPTH = 250  # pydantic's JSON parser (jiter) reads no deeper: 400 json_too_deep
PARSE_ON_LOOP_BYTES = 64 * 1024  # larger bodies are parsed on a worker thread, not the event loop
