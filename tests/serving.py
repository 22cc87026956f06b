"""A real `python -m verispec serve` process on a free loopback port, for the HTTP tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
from prometheus_client import parser

STARTUP_TIMEOUT = 120.0
REQUEST_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(proc: ServerProcess, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(proc.url + "/health", headers=headers, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    proc.stop()
    raise AssertionError(f"server not healthy after {STARTUP_TIMEOUT} s:\n{proc.output()}")


class ServerProcess:
    """`python -m verispec serve ARGS` on a free port, waited for until /health answers; `stop` sends SIGTERM."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "verispec", "serve", "--port", str(self.port), "--threads", "2", *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        key = args[args.index("--api-key") + 1] if "--api-key" in args else os.environ.get("VERISPEC_API_KEY")
        if "--metrics-key" in args:
            key = args[args.index("--metrics-key") + 1]
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}  # what /metrics needs
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"verispec-serve-{self.port}.log", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"server not healthy after {STARTUP_TIMEOUT} s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-5000:]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", timeout=REQUEST_TIMEOUT, max_retries=0)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        values = {}
        for family in parser.text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values

    def wait_metrics(self, predicate, timeout: float = 10.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            values = self.metrics()
            if predicate(values) or time.monotonic() > deadline:
                return values
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
