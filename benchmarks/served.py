"""A `verispec serve` process for the benchmarks that measure through HTTP (bystander.py, tenants.py, replay.py):
started on a free loopback port with the given flags, waited for until /health answers, stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

import httpx


class ServedProcess:
    def __init__(self, flags: list[str], startup_seconds: float = 600) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "verispec", "serve", "--port", str(self.port), *flags]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + startup_seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"verispec serve {' '.join(flags)} did not start")

    def rss_mib(self) -> float:
        """The server's resident memory."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            line = next(line for line in status if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)
