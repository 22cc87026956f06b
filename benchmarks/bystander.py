"""What one hostile client costs everyone else: a bystander's latency and /health's, alone and while each hostile
probe runs against the same `verispec serve`.

    python benchmarks/bystander.py [--repeats 5] [-- SERVE FLAGS]      (default: the bundled pair, its defaults)

The bystander is a short greedy chat request (16 tokens, not streamed, each with a cache_salt of its own so that
none copies the one before), sent `--repeats` times alone and then while each probe keeps the server busy; /health
is polled throughout. The control probe is a legitimate long request: what any neighbour costs a bystander.
Probes: 16 stop strings of the longest length on a long generation, 4 MB token-id prompts, chat bodies of 120,000
empty messages, 8 MiB request lines and headers, hundreds of idle connections, headers sent a byte at a time,
schema chains deep enough to crash a grammar library; one at a time (sent again as soon as it is answered), and
eight at once where it says so. Bodies are built before timing starts.

The clients share the machine's cores with the server: the hostile one runs in a process of its own at the lowest
priority (nice 19), so that what is measured is what the server's own work for a hostile request costs the
bystander, not the CPU the hostile client burns (on a real network, another machine's). The target: a
bystander within 1.5x of alone while any one hostile request runs, and /health within 0.5 s under all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import httpx
from served import ServedProcess

BYSTANDER = {"messages": [{"role": "user", "content": "Name three fruits."}], "max_tokens": 16, "temperature": 0}
NEIGHBOUR = {"prompt": "Write 400 spaces:", "max_tokens": 400, "ignore_eos": True, "temperature": 0}


class Server(ServedProcess):
    def post(self, route: str, body: bytes | dict, timeout: float = 300) -> int:
        body = json.dumps(body).encode() if isinstance(body, dict) else body
        headers = {"Content-Type": "application/json"}
        with contextlib.suppress(httpx.HTTPError):
            return httpx.post(self.url + route, content=body, headers=headers, timeout=timeout).status_code
        return 0


def _raw(server: Server, data: bytes, pause: float = 0.0) -> None:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        if pause:
            for byte in data:
                sock.send(bytes([byte]))
                time.sleep(pause)
        else:
            sock.sendall(data)
        sock.recv(100)


def _many(count: int, work: Callable[[], object]) -> Callable[[Server], None]:
    def run(_: Server) -> None:
        threads = [threading.Thread(target=work) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return run


def probes(server: Server) -> dict[str, Callable[[], None]]:
    stops = json.dumps({"prompt": "Write 400 spaces:", "max_tokens": 400, "ignore_eos": True, "temperature": 0,
                        "stop": [" " * 255 + chr(97 + i) for i in range(16)]}).encode()  # fmt: skip
    ids = json.dumps({"prompt": [7] * 1_300_000, "max_tokens": 4}).encode()
    messages = json.dumps({"messages": [{"role": "user", "content": ""}] * 120_000, "max_tokens": 4}).encode()
    chain = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(1000)}
    schema = {"$defs": chain, "$ref": "#/$defs/d0"}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    grammar = json.dumps({**BYSTANDER, "max_tokens": 4, "response_format": response_format}).encode()
    line = b"GET /" + b"a" * (8 * 2**20) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    headers = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * (8 * 2**20) + b"\r\n\r\n"

    def idle() -> None:
        sockets = []
        for _ in range(500):
            with contextlib.suppress(OSError):
                sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(8)
        for sock in sockets:
            sock.close()

    chat, completion = "/v1/chat/completions", "/v1/completions"
    neighbour = json.dumps(NEIGHBOUR).encode()
    return {
        "(control) a 400-token neighbour": lambda: server.post(completion, neighbour),
        "stop strings (16 x 256 chars)": lambda: server.post(completion, stops),
        "a 4 MB token-id prompt": lambda: server.post(completion, ids),
        "8 x 4 MB token-id prompts": lambda: _many(8, lambda: server.post(completion, ids))(server),
        "120k empty messages": lambda: server.post(chat, messages),
        "8 x 120k empty messages": lambda: _many(8, lambda: server.post(chat, messages))(server),
        "an 8 MiB request line": lambda: _raw(server, line),
        "8 x 8 MiB request lines": lambda: _many(8, lambda: _raw(server, line))(server),
        "8 MiB of headers": lambda: _raw(server, headers),
        "500 idle connections": idle,
        "100 headers a byte at a time": lambda: _many(100, lambda: _raw(server, b"GET /health HTTP/1.1\r\n", 0.5))(
            server
        ),
        "a schema chain of 1,000 $refs": lambda: server.post(chat, grammar),
    }


def _bystander(server: Server, repeats: int, probe: Callable[[], object] | None) -> tuple[float, float, int]:
    """(median bystander seconds, slowest /health seconds, bystanders not answered 200) over `repeats`
    bystanders, while `probe` runs again and again."""
    times, health, failed = [], [0.0], 0
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            began = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(server.url + "/health", timeout=10)
            health[0] = max(health[0], time.monotonic() - began)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    # the hostile client: a process of its own at the lowest priority, sending the probe again and again
    hostile = multiprocessing.get_context("fork").Process(target=_again_and_again, args=(probe,), daemon=True)
    if probe is not None:
        hostile.start()
    time.sleep(0.5)  # the probe is under way
    for _ in range(repeats):  # each its own partition: nothing copied from the one before, as a fresh client
        began = time.monotonic()
        failed += server.post("/v1/chat/completions", {**BYSTANDER, "cache_salt": uuid.uuid4().hex}) != 200
        times.append(time.monotonic() - began)
    done.set()
    poller.join()
    if probe is not None:
        hostile.kill()
        hostile.join()
    return statistics.median(times), health[0], failed


def _again_and_again(probe: Callable[[], object]) -> None:
    os.nice(19)
    while True:
        probe()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("flags", nargs="*", help="verispec serve flags (after --)")
    args = parser.parse_args()
    server = Server(args.flags or ["--threads", str(os.cpu_count() or 2)])
    try:
        alone, health, failed = _bystander(server, args.repeats, None)
        print(f"{'probe':<34} {'bystander s':>11} {'x alone':>8} {'/health max s':>14} {'not 200':>8}")
        print(f"{'(alone)':<34} {alone:>11.2f} {1.0:>8.2f} {health:>14.3f} {failed:>8}")
        for name, probe in probes(server).items():
            seconds, health, failed = _bystander(server, args.repeats, probe)
            alive = "" if server.proc.poll() is None else "  DIED"
            print(f"{name:<34} {seconds:>11.2f} {seconds / alone:>8.2f} {health:>14.3f} {failed:>8}{alive}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
