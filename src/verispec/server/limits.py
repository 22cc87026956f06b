"""What the server reads and how long it waits: the defaults of its limit flags, and the fixed limits (each
answered with the status docs/server.md lists)."""

DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # --max-body-bytes: 413 beyond (a 4,096-token prompt is tens of kilobytes)
DEFAULT_GRAMMAR_TIMEOUT = 10.0  # --grammar-timeout: seconds a new grammar may take to be checked and compiled
MAX_JSON_DEPTH = 250  # pydantic's JSON parser (jiter) reads no deeper: 400 json_too_deep
PARSE_ON_LOOP_BYTES = 64 * 1024  # larger bodies are parsed on a worker thread, not the event loop
DEFAULT_BODY_TIMEOUT = 60.0  # --body-timeout: seconds a request body may take to arrive (408 beyond)
MAX_HEAD_BYTES = 64 * 1024  # a request's line and headers: 400 beyond (browsers send under 8 KiB)
DEFAULT_HEADER_TIMEOUT = 10.0  # --header-timeout: seconds to send a request's line and headers, then closed
KEEP_ALIVE_SECONDS = 5  # an idle connection between requests is closed after this (uvicorn's default)
DEFAULT_MAX_CONNECTIONS = 256  # --max-connections: more are closed as they are accepted
