"""Where converted forms of a model file are cached, and which cached forms a new one supersedes.

A key names the file (stem and a hash of its path), the form (a weight format, or the native kernels'
index and tiles), the cache format version, and the file's size and modification time, so that a changed
file, another format or a new verispec never reads a stale cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .bundled import cache_dir, remove_stale_temporaries

_CONVERTED_FORMAT = 3  # bump when a converted layout changes (3: configs of every architecture, rope scaling)


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


@contextmanager
def writing(folder: Path, path: Path) -> Iterator[Path]:
    """A temporary folder to write a converted form of `path` into, its `config.json` last (that file marks a
    form complete). When the block completes, superseded forms are removed and the folder is renamed into
    place, unless another process completed the same form first; on any error it is removed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder.parent)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        remove_superseded(folder, path)
        if not (folder / "config.json").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
