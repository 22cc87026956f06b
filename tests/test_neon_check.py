"""The AArch64 (NEON) kernels, checked bit for bit against the portable ones without ARM hardware:
tools/neon-check.sh cross-compiles tests/native/neon_check.c with the kernel sources and runs it under qemu-user on
three emulated CPUs (with sdot and smmla, with sdot only, with neither), then compares a digest of the portable
path's results with a build for this host. Skipped without the cross compiler or
qemu (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 (apt-get install gcc-aarch64-linux-gnu qemu-user)",
)


def test_neon_paths_compute_the_portable_bits_under_qemu():
    run = subprocess.run(
        [str(ROOT / "tools" / "neon-check.sh")], capture_output=True, text=True, timeout=900, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # every emulated CPU ran, each picked the path its features call for, and the negative controls were seen
    assert run.stdout.count("neon_check: OK:") == 3, run.stdout
    for path in ("neon_i8mm", "neon_dot", "neon"):
        assert f"the library's best path: {path} (the CPU's features call for {path})" in run.stdout
    assert "negative controls (a flipped weight bit) detected" in run.stdout
    # off AArch64, the portable path's digest was compared with a native build's (the exit status holds the result)
    assert platform.machine() == "aarch64" or "the portable path's digest" in run.stdout, run.stdout
