"""The KV cache budget (--kv-cache-memory): how many blocks the target's and the draft model's caches get.

The budget pays for both caches alike: N blocks each, N = budget // (a target block's bytes + a draft block's). By
default it is what the scheduler asks for (4,096 positions per slot, or one whole context if that is more: blocks
are taken as sequences write), capped at DEFAULT_SHARE of the memory available when the engine starts (on a
CPU, MemAvailable from /proc/meminfo, read after the weights are loaded; on a GPU, its free memory): the caches grow
with use, and a full one must not push the machine into swapping or the process into the OOM killer.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import InvalidParameterError

DEFAULT_SHARE = 0.5  # of the memory available at start, the most the default budget takes
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_memory(text: str | int) -> int:
    """Bytes from an integer or a size with a unit: 4GiB, 512MiB, 1.5GB, 2000000 (k/M/G/T: powers of 1000; KiB, MiB,
    GiB, TiB: powers of 1024)."""
    if isinstance(text, int):
        value = text
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
        unit = found.group(2).lower() if found else None
        if unit not in _UNITS:
            raise InvalidParameterError(f"a memory size is bytes or a number with a unit (4GiB, 512MiB), got {text!r}")
        value = int(float(found.group(1)) * _UNITS[unit])
    if value < 1:
        raise InvalidParameterError(f"a memory size must be at least 1 byte, got {text!r}")
    return value


def available_memory(device: torch.device) -> int | None:
    """Bytes the machine can still give (a GPU's free memory for a GPU), or None where it cannot tell."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_budget(wanted: int, device: torch.device) -> int:
    """`wanted` bytes (every slot's full context), at most DEFAULT_SHARE of the memory available."""
    available = available_memory(device)
    return wanted if available is None else min(wanted, int(available * DEFAULT_SHARE))


def cache_blocks(budget: int | None, wanted_blocks: int, block_bytes: int, device: torch.device) -> int:
    """The blocks each cache gets: `budget` bytes (None: default_budget of `wanted_blocks`) over `block_bytes`, the
    bytes of a block of each cache together."""
    if budget is None:
        budget = default_budget(wanted_blocks * block_bytes, device)
    return budget // block_bytes
