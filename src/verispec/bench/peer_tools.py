"""What every peer (another engine run beside verispec) shares: the error when its packages or programs are
missing, the package check, and the cut at the first stop token."""

from __future__ import annotations

import importlib.util

from ..errors import VerispecError


class PeerUnavailableError(VerispecError):
    """A peer was asked for but the packages it needs are not installed."""


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # ValueError: a module whose __spec__ is None (e.g. blocked in sys.modules)
        return False


def cut_at_stop(tokens: list[int], stop_ids: set[int]) -> tuple[list[int], str]:
    """Tokens before the first stop token (which verispec never returns), and the finish reason."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[:i], "stop"
    return tokens, "length"
