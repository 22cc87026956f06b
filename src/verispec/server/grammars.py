"""Structured-output grammars for the server: each new grammar is checked in a worker process first
(grammar_worker.py), with a time limit, and given up when its client goes away; only then is it compiled in the
server (grammar.GrammarCompiler, on a thread with a larger stack than the worker's).

A grammar that crashes the grammar library, or runs past the time limit, costs one worker process (started
again for the next grammar) and its request a 400; the server and its other requests never notice. Grammars
the compiler has cached skip the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..decoding.grammar import Grammar, GrammarCompiler, GrammarError, GrammarSpec, short_message

log = logging.getLogger("verispec.server")
WORKER_SCRIPT = Path(__file__).with_name("grammar_worker.py")
WORKER_STACK_BYTES = 8 * 2**20  # the default main-thread stack of Linux; the server's compile threads have 8x
START_TIMEOUT = 120.0  # a worker's start (Python, llguidance, the tokenizer's index: ~2 s for 150k tokens)
POLL_SECONDS = 0.5  # how often a waiting check looks at the clock and the client


class ClientGoneError(Exception):
    """The client went away while its grammar was being checked."""


class _WorkerDied(Exception):
    pass


class GrammarWorker:
    """One worker process, started on first use and again after it dies or is killed."""

    def __init__(self, setup: str):
        self.setup = setup  # the first line it reads: the tokenizer and the stack size
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()  # one check at a time

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )  # fmt: skip
        self._send(self.setup)
        self._receive()

    def check(self, kind: str, value: str) -> dict:
        """The worker's answer: {"source"} or {"error"}; raises _WorkerDied if it dies meanwhile."""
        self._send(json.dumps({"kind": kind, "value": value}))
        return self._receive()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

    def _send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise _WorkerDied() from None

    def _receive(self) -> dict:
        try:
            line = self.proc.stdout.readline()
        except (OSError, ValueError):
            line = ""
        if not line:
            raise _WorkerDied()
        return json.loads(line)


class GrammarWorkers:
    """`compile(spec, gone)`: a Grammar, or GrammarError (a 400), or ClientGoneError."""

    def __init__(self, compiler: GrammarCompiler, workers: int = 1, timeout: float = 10.0,
                 stack_bytes: int = WORKER_STACK_BYTES):  # fmt: skip
        self.compiler, self.timeout = compiler, timeout
        self.stack_bytes = stack_bytes
        self.count = workers
        self._idle: asyncio.Queue[GrammarWorker] | None = None
        self.crashes = 0  # workers lost to a grammar (for the log and tests)

    def _setup(self) -> str:
        compiler = self.compiler
        return json.dumps({
            "tokenizer": compiler.tokenizer.raw.to_str(), "n_vocab": compiler.vocab_size, "eos": compiler.stop_ids,
            "stack_bytes": self.stack_bytes,
        })  # fmt: skip

    def _workers(self) -> asyncio.Queue[GrammarWorker]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            setup = self._setup()
            for _ in range(self.count):
                self._idle.put_nowait(GrammarWorker(setup))
        return self._idle

    async def compile(self, spec: GrammarSpec, gone: Callable[[], Awaitable[bool]]) -> Grammar:
        if (grammar := self.compiler.cached(spec)) is not None:
            return grammar
        idle = self._workers()
        worker = await idle.get()
        try:
            await asyncio.to_thread(self._start, worker)
            reply = await self._check(worker, spec, gone)
        finally:
            idle.put_nowait(worker)
        if "error" in reply:
            raise GrammarError(f"invalid {spec.kind.replace('_', ' ')}: {short_message(reply['error'])}")
        return await asyncio.to_thread(self.compiler.compile, spec, reply["source"])

    def _start(self, worker: GrammarWorker) -> None:
        try:
            worker.start()
        except _WorkerDied:
            worker.kill()
            raise GrammarError("structured output is unavailable: the grammar checker did not start") from None

    async def _check(self, worker: GrammarWorker, spec: GrammarSpec, gone: Callable[[], Awaitable[bool]]) -> dict:
        began = time.monotonic()
        future = asyncio.ensure_future(asyncio.to_thread(worker.check, *spec.library_input()))
        while True:
            done, _ = await asyncio.wait({future}, timeout=POLL_SECONDS)
            if done:
                break
            if await gone():
                worker.kill()
                with contextlib.suppress(_WorkerDied):
                    await future
                raise ClientGoneError()
            if time.monotonic() - began > self.timeout:
                worker.kill()
                with contextlib.suppress(_WorkerDied):
                    await future
                raise GrammarError(
                    f"the {spec.kind.replace('_', ' ')} took longer than {self.timeout:g} s to compile "
                    "(the server's --grammar-timeout)"
                )
        try:
            return future.result()
        except _WorkerDied:
            code = worker.proc.wait() if worker.proc is not None else None
            self.crashes += 1
            log.warning("a grammar crashed its checking process (exit %s); the request gets a 400", code)
            raise GrammarError(
                f"the {spec.kind.replace('_', ' ')} crashed the grammar compiler (too deeply nested for it); "
                "see the limits in docs/structured-output.md"
            ) from None

    def close(self) -> None:
        if self._idle is not None:
            while not self._idle.empty():
                self._idle.get_nowait().kill()
