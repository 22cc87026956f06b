"""Who may ask, before any route runs: the Host (and a browser's Origin) the server answers, and the API key a /v1/
route (and /metrics) needs. The one-process server and the cluster's ingress (server/cluster/ingress.py) put the
same guard in front of their routes."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi.responses import JSONResponse

from .protocol import ApiError

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def allowed_hosts_for(bound: str, given: list[str] | None) -> frozenset[str] | None:
    """The Host names a server bound to `bound` answers: `given` (--allowed-hosts; '*' = any); else, bound to
    a wildcard address, any (a network-facing server is reached by names it cannot know: use --api-key);
    else the bound address and the loopback names. A page's request through DNS rebinding carries the
    attacker's name in Host, and a cross-site request carries its page's Origin: both are refused."""
    if given:
        return None if "*" in given else frozenset(h.strip("[]").lower() for h in given)
    if bound in {"0.0.0.0", "::", ""}:
        return None
    return LOOPBACK_NAMES | {bound.strip("[]").lower()}


def _hostname(value: str) -> str:
    """'example.com' from 'example.com:8000', '::1' from '[::1]:8000', lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """ASGI middleware refusing, before any route runs: a Host (or browser Origin) not in the allowed names,
    then, with an API key set, a /v1/ request without it; `refused(label)` counts each refusal. Written against
    ASGI directly: Starlette's BaseHTTPMiddleware would hide a client's disconnect from the handlers, which
    cancel on it. The cluster's ingress (server/cluster/ingress.py) puts the same guard in front of its replicas."""

    def __init__(
        self, app, api_keys: tuple[str, ...], allowed_hosts: frozenset[str] | None, refused: Callable[[str], None],
        metrics_key: str | None = None,
    ) -> None:  # fmt: skip
        self.app, self.allowed_hosts, self.refused, self.api_keys = app, allowed_hosts, refused, api_keys
        self.metrics_key = metrics_key

    async def __call__(self, scope, receive, send) -> None:
        refused = self._refusal(scope) if scope["type"] == "http" else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        error, label = refused
        self.refused(label)
        await JSONResponse(error.body(), status_code=error.status, headers=error.headers)(scope, receive, send)

    def _refusal(self, scope) -> tuple[ApiError, str] | None:
        """(the answer, its label in the metrics), or None to let the request in."""
        headers = {k.decode("latin-1"): v for k, v in scope["headers"]}
        allowed = self.allowed_hosts
        if allowed is not None:
            host = _hostname(headers.get("host", b"").decode("latin-1"))
            if host not in allowed:
                message = f"Host '{host}' is not served here (see --allowed-hosts)"
                return ApiError(400, message, code="invalid_host"), "invalid_host"
            origin = headers.get("origin")  # browsers send it; "null" from sandboxed pages is refused too
            if origin is not None:
                text = origin.decode("latin-1")
                if _hostname(text.split("://", 1)[-1].split("/")[0]) not in allowed:
                    message = f"requests from pages of {text} are refused (see --allowed-hosts)"
                    return ApiError(403, message, code="invalid_origin"), "invalid_origin"
        given = headers.get("authorization", b"")
        if scope["path"] == "/metrics":
            return self._metrics_refusal(given)
        if self.api_keys and _needs_key(scope["path"]) and key_index(self.api_keys, given) is None:
            return _key_refusal(given)
        return None

    def _metrics_refusal(self, given: bytes) -> tuple[ApiError, str] | None:
        """/metrics shows the whole server's traffic: with --metrics-key, that key opens it; else with one API key
        (one tenant) that key, and with several, nothing (one tenant would see another's requests)."""
        if self.metrics_key is not None:
            return None if key_index((self.metrics_key,), given) is not None else _key_refusal(given)
        if len(self.api_keys) > 1:
            message = "/metrics shows every tenant's traffic: with several API keys it needs a key of its own " \
                "(--metrics-key)"  # fmt: skip
            return ApiError(403, message, code="metrics_key_needed"), "metrics_key_needed"
        if self.api_keys and key_index(self.api_keys, given) is None:
            return _key_refusal(given)
        return None


def _key_refusal(given: bytes) -> tuple[ApiError, str]:
    message = "a valid API key is needed: send the header 'Authorization: Bearer <key>'"
    error = ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return error, "invalid_api_key" if given else "missing_api_key"


def key_index(keys: tuple[str, ...], authorization: bytes) -> int | None:
    """Which of `keys` an Authorization header carries as its bearer token, or None. Every key is compared, each in
    time independent of where they differ: the time tells nothing of a key."""
    found = None
    for index, key in enumerate(keys):
        if hmac.compare_digest(authorization, f"Bearer {key}".encode()):
            found = index
    return found


def _needs_key(path: str) -> bool:
    """With an API key set: every /v1/ route (/metrics has its own rule); /health stays open for load balancers."""
    return (path + "/").startswith("/v1/")
