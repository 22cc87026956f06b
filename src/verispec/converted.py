"""Where converted forms of a model file are cached, and which cached forms a new one supersedes.

A key names the file (stem and a hash of its path), the form (a weight format, or the native kernels'
index and tiles), the cache format version, and the file's size and modification time, so that a changed
file, another format or a new verispec never reads a stale cache.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from .bundled import cache_dir

_CONVERTED_FORMAT = 2  # bump when a converted layout changes


def converted_folder(path: Path, form: str) -> Path:
    resolved = path.resolve()
    stat = resolved.stat()
    where = hashlib.sha1(str(resolved).encode()).hexdigest()[:8]
    key = f"{path.stem}-{where}-{form}-v{_CONVERTED_FORMAT}-{stat.st_size}-{int(stat.st_mtime)}"
    return cache_dir() / "converted" / key


def remove_superseded(folder: Path, path: Path) -> None:
    """Conversions into the same form of the same file path made before the file changed, and conversions of
    that file into older converted formats (key: <stem>-<path hash>-<form>-v<format>-<size>-<mtime>)."""
    same_form = folder.name[: folder.name.rindex(f"-v{_CONVERTED_FORMAT}-")]
    for other in folder.parent.iterdir():
        if other == folder or ".tmp" in other.name or not other.is_dir():
            continue
        older = other.name.startswith(f"{path.stem}-") and f"-v{_CONVERTED_FORMAT}-" not in other.name
        if other.name.startswith(same_form + "-") or older:
            shutil.rmtree(other, ignore_errors=True)
