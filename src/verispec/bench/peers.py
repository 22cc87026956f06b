"""The peers a bench may run beside verispec (`--peers`): hf (transformers), llamacpp (llama-cpp-python),
llamacpp-native (llama.cpp's own programs); each lives in a module of its own."""

from __future__ import annotations

from . import hf, llamacpp, llamacpp_native


def check_available(peers: tuple[str, ...], from_files: bool = True) -> None:
    """Fail before any model is loaded when a peer's packages or programs are missing."""
    if "llamacpp" in peers:
        llamacpp.check_available()
    if "llamacpp-native" in peers:
        llamacpp_native.check_available()
    if "hf" in peers:
        hf.check_available(from_files)


def peer_settings() -> dict:
    """Each peer method's settings, as the report prints them."""
    return llamacpp.peer_settings() | llamacpp_native.peer_settings() | hf.peer_settings()
