"""Where people keep their models, read offline: the Hugging Face hub cache, Ollama's store and LM Studio's folders.

Each store answers two questions: which file or folder a name means there (`hub_cached`, `ollama_blob`,
`lmstudio_file`; None where the store has no such name), and which models it holds (`hub_entries`, `ollama_entries`,
`lmstudio_entries`: (name, path) pairs whose names the first question answers). Nothing here opens a model or touches
the network; the locations follow the stores' own environment variables:

    Hugging Face   $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
                   ~/.cache/huggingface/hub; models--ORG--NAME/refs/REVISION holds a commit, snapshots/COMMIT the files
    Ollama         $OLLAMA_MODELS, else ~/.ollama/models; manifests/HOST/NAMESPACE/MODEL/TAG is JSON whose layer of
                   mediaType application/vnd.ollama.image.model names the GGUF blob (blobs/sha256-HEX)
    LM Studio      ~/.lmstudio/models and ~/.cache/lm-studio/models; PUBLISHER/REPO/*.gguf

A repository or folder holding several GGUF files is given a tag to pick one (`Org/Repo:Q4_K_M`, as llama.cpp's `-hf`
and Ollama take it): the file whose quantization (read from its name) is the tag, else the one whose name contains
it; without a tag, Q4_K_M where there is one (llama.cpp's default), the only file where there is one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from ..errors import ModelLoadError

OLLAMA_REGISTRY, OLLAMA_NAMESPACE, OLLAMA_TAG = "registry.ollama.ai", "library", "latest"
OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_TEMPLATE = "application/vnd.ollama.image.template"
OLLAMA_PARAMS = "application/vnd.ollama.image.params"
PREFERRED_QUANT = "Q4_K_M"  # a repository's file without a tag, where it has several (llama.cpp's -hf default)
_QUANT = re.compile(r"(?i)(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


# ---- locations -----------------------------------------------------------------------------------------------------
def hub_cache() -> Path:
    """The Hugging Face hub cache, as huggingface_hub finds it (read now, not at import: tests move HOME)."""
    env = os.environ
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    home = env.get("HF_HOME") or os.path.join(cache, "huggingface")
    return Path(home).expanduser() / "hub"


def ollama_home() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def lmstudio_homes() -> list[Path]:
    return [Path("~/.lmstudio/models").expanduser(), Path("~/.cache/lm-studio/models").expanduser()]


def looked_at() -> str:
    """Where a name was looked for, for the one line that says it was found nowhere."""
    lmstudio = " and ".join(str(home) for home in lmstudio_homes())
    return f"the Hugging Face cache ({hub_cache()}), Ollama's store ({ollama_home()}), LM Studio's folders ({lmstudio})"


# ---- names and tags ------------------------------------------------------------------------------------------------
def split_tag(name: str) -> tuple[str, str | None]:
    """("Org/Repo", "Q4_K_M") of "Org/Repo:Q4_K_M"; (name, None) without a tag."""
    base, colon, tag = name.rpartition(":")
    if not colon or not base or not tag or "/" in tag:
        return name, None
    return base, tag


def quant_of(filename: str) -> str | None:
    """The quantization a GGUF file's name says (the last one it names), upper-case: Q4_K_M, IQ4_XS, F16..."""
    found = _QUANT.findall(Path(filename).stem)
    return found[-1].upper() if found else None


def gguf_files(folder: Path) -> list[Path]:
    """The model GGUF files in a folder and its subfolders (not a vision projector), by name."""
    return sorted(p for p in folder.rglob("*.gguf") if p.is_file() and "mmproj" not in p.name.lower())


def is_weights_folder(folder: Path) -> bool:
    """A Hugging Face checkpoint folder: a config.json beside safetensors weights."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def pick(folder: Path, tag: str | None, label: str) -> Path | None:
    """What `label` (a repository or folder) means with `tag`: the checkpoint folder itself, or one of its GGUF files
    (module docstring); None where it holds neither. ModelLoadError where the tag picks none, or several files remain
    and no tag chooses."""
    files = gguf_files(folder)
    if tag is None and is_weights_folder(folder):
        return folder
    if tag is None:
        if len(files) <= 1:
            return files[0] if files else None
        preferred = [f for f in files if quant_of(f.name) == PREFERRED_QUANT]
        if preferred:
            return preferred[0]
        raise ModelLoadError(f"{label} holds {len(files)} GGUF files: pick one with a tag, {_choices(label, files)}")
    exact = [f for f in files if quant_of(f.name) == tag.upper()]
    loose = [f for f in files if tag.lower() in f.name.lower()]
    if exact or loose:
        return (exact or loose)[0]
    if not files:
        return None
    raise ModelLoadError(f"{label} has no GGUF file for the tag '{tag}': {_choices(label, files)}")


def _choices(label: str, files: list[Path]) -> str:
    tags = sorted({quant_of(f.name) or f.stem for f in files})
    return "e.g. " + ", ".join(f"{label}:{tag}" for tag in tags)


def entries_of(folder: Path, label: str) -> list[tuple[str, Path]]:
    """The models a repository or folder holds, each named so that `pick` finds it again: the checkpoint folder as
    `label`, a lone GGUF file as `label`, several as `label:QUANT`."""
    found = [(label, folder)] if is_weights_folder(folder) else []
    files = gguf_files(folder)
    if len(files) == 1 and not found:
        return [(label, files[0])]
    tagged = {}
    for file in files:
        tag = quant_of(file.name) or file.stem
        if pick(folder, tag, label) == file:  # a tag that finds another file first names none of its own
            tagged.setdefault(f"{label}:{tag}", file)
    return found + list(tagged.items())


# ---- the Hugging Face hub cache --------------------------------------------------------------------------------------
def hub_folder(repo: str) -> Path:
    return hub_cache() / ("models--" + repo.replace("/", "--"))


def hub_snapshot(repo: str, revision: str | None = None) -> Path | None:
    """The cached snapshot of `repo` at `revision` (a branch or tag in refs/, or a commit; None: main)."""
    folder = hub_folder(repo)
    revision = revision or "main"
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision if _COMMIT.match(revision) else None
    snapshot = folder / "snapshots" / commit if commit else None
    return snapshot if snapshot is not None and snapshot.is_dir() else None


def hub_cached(name: str, revision: str | None = None) -> Path | None:
    """The file or folder `Org/Repo[:TAG]` means in the hub cache, None where it is not cached."""
    repo, tag = split_tag(name)
    if not is_repo_id(repo):
        return None
    snapshot = hub_snapshot(repo, revision)
    return None if snapshot is None else pick(snapshot, tag, repo)


def is_repo_id(text: str) -> bool:
    """Whether `text` may be a Hugging Face repository id (ORG/NAME, the hub's characters)."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", text) is not None and not text.endswith(".gguf")


def hub_entries() -> Iterator[tuple[str, Path]]:
    root = hub_cache()
    if not root.is_dir():
        return
    for folder in sorted(root.glob("models--*")):
        repo = folder.name.removeprefix("models--").replace("--", "/", 1)
        snapshot = hub_snapshot(repo) or _newest(folder / "snapshots")
        if snapshot is not None:
            yield from entries_of(snapshot, repo)


def _newest(snapshots: Path) -> Path | None:
    found = [p for p in snapshots.glob("*") if p.is_dir()] if snapshots.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


# ---- Ollama ----------------------------------------------------------------------------------------------------------
def ollama_manifest(name: str) -> Path | None:
    """The manifest of an Ollama name ([HOST/][NAMESPACE/]MODEL[:TAG]; registry.ollama.ai, library, latest)."""
    base, tag = split_tag(name)
    parts = base.split("/")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"[\w.-]+", part) for part in parts):
        return None
    host, namespace = OLLAMA_REGISTRY, OLLAMA_NAMESPACE
    if len(parts) == 3:
        host, namespace = parts[0], parts[1]
    elif len(parts) == 2:
        namespace = parts[0]
    for spelling in dict.fromkeys((tag or OLLAMA_TAG, (tag or OLLAMA_TAG).lower())):
        manifest = ollama_home() / "manifests" / host / namespace / parts[-1] / spelling
        if manifest.is_file():
            return manifest
    return None


def ollama_layers(manifest: Path) -> dict[str, Path]:
    """A manifest's layers: media type -> blob path (ModelLoadError where the manifest does not parse)."""
    try:
        layers = json.loads(manifest.read_text()).get("layers", [])
        return {layer["mediaType"]: ollama_home() / "blobs" / layer["digest"].replace(":", "-") for layer in layers}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"{manifest}: not a readable Ollama manifest ({type(exc).__name__}: {exc})") from None


def ollama_blob(name: str) -> Path | None:
    """The GGUF blob an Ollama name means, None where the store has no such name."""
    manifest = ollama_manifest(name)
    if manifest is None:
        return None
    blob = ollama_layers(manifest).get(OLLAMA_MODEL)
    if blob is None or not blob.is_file():
        raise ModelLoadError(f"{manifest}: the Ollama model's weights blob is missing ({blob}); fix: ollama pull "
                             f"{name}")  # fmt: skip
    return blob


def ollama_entries() -> Iterator[tuple[str, Path]]:
    root = ollama_home() / "manifests"
    if not root.is_dir():
        return
    for manifest in sorted(p for p in root.glob("*/*/*/*") if p.is_file()):
        host, namespace, model, tag = manifest.relative_to(root).parts
        prefix = "" if host == OLLAMA_REGISTRY and namespace == OLLAMA_NAMESPACE else f"{namespace}/"
        prefix = f"{host}/{namespace}/" if host != OLLAMA_REGISTRY else prefix
        blob = ollama_layers(manifest).get(OLLAMA_MODEL)
        if blob is not None and blob.is_file():
            yield f"{prefix}{model}:{tag}", blob


# ---- LM Studio -------------------------------------------------------------------------------------------------------
def lmstudio_file(name: str) -> Path | None:
    """The GGUF file an LM Studio model key (PUBLISHER/REPO[:TAG], or PUBLISHER/REPO/FILE.gguf) means."""
    base, tag = split_tag(name)
    parts = base.split("/")
    if len(parts) not in (2, 3) or any(part in ("", ".", "..") for part in parts):
        return None
    for home in lmstudio_homes():
        found = home.joinpath(*parts)
        if len(parts) == 3 and found.is_file():
            return found
        if len(parts) == 2 and found.is_dir():
            picked = pick(found, tag, base)
            if picked is not None and picked.is_file():
                return picked
    return None


def lmstudio_entries() -> Iterator[tuple[str, Path]]:
    for home in lmstudio_homes():
        if home.is_dir():
            for folder in sorted(p for p in home.glob("*/*") if p.is_dir()):
                label = "/".join(folder.relative_to(home).parts)
                yield from ((name, path) for name, path in entries_of(folder, label) if path.is_file())
