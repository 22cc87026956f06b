"""What a model source names, as a local file or folder: the one rule `--model`, `--speculative-model` and the Python
API follow.

In order, the first that answers:
  1. a path that exists (a .gguf file or a Hugging Face checkpoint folder); a bundled name ('target', 'draft', their
     full names) is left to bundled.py, which joins its parts on first use;
  2. a Hugging Face repo id (`Qwen/Qwen2.5-7B-Instruct`, `Org/Repo-GGUF:Q4_K_M`, at `revision`) in the hub cache;
  3. an LM Studio model key (`publisher/repo[:TAG]`) in LM Studio's folders;
  4. an Ollama name (`qwen2.5-coder:7b`; tag `latest` by default) in Ollama's store: its GGUF blob;
  5. a repo id not cached, where the hub may be reached (HF_HUB_OFFLINE unset): downloaded into the hub cache with a
     progress bar (huggingface_hub, which reads HF_TOKEN and HF_ENDPOINT), then as 2.
Otherwise one line says where it looked and how to get the model. Steps 1-4 read only the file system (stores.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelLoadError
from . import bundled, stores

_TRUE = {"1", "on", "yes", "true"}
_FOLDER_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]  # a checkpoint folder's files worth fetching


def locate(source: str, revision: str | None = None, progress: bool = True) -> Path:
    """The file or folder `source` names (module docstring); ModelLoadError in one line where it names none."""
    if bundled.is_bundled_name(source):
        return bundled.bundled_path(source, progress=progress)
    return Path(resolve(source, revision, progress))


def resolve(source: str, revision: str | None = None, progress: bool = True) -> str:
    """`source` as a path string (a bundled name returned as given: bundled.py locates it)."""
    if bundled.is_bundled_name(source):
        return source
    path = Path(source).expanduser()
    if path.exists():
        if not os.access(path, os.R_OK):
            raise ModelLoadError(f"model path is not readable: {path}")
        return str(path)
    if source.startswith((".", "/", "~", "\\")):
        raise ModelLoadError(f"model path does not exist: {path}")
    found = stored(source, revision)
    if found is None and stores.is_repo_id(stores.split_tag(source)[0]) and not offline():
        found = download(source, revision, progress)
    if found is None and source.endswith(".gguf"):
        raise ModelLoadError(f"model path does not exist: {path} (nor is it a file in LM Studio's folders)")
    if found is None:
        raise ModelLoadError(nowhere(source))
    return str(found)


def stored(name: str, revision: str | None = None) -> Path | None:
    """Where the stores hold `name` (steps 2-4), None where none does."""
    return stores.hub_cached(name, revision) or stores.lmstudio_file(name) or stores.ollama_blob(name)


def nowhere(name: str) -> str:
    how = f"hf download {stores.split_tag(name)[0]}" if "/" in name else f"ollama pull {name}"
    online = "" if not offline() else " (HF_HUB_OFFLINE is set: nothing was downloaded)"
    return (
        f"model '{name}' not found: no such file or folder, and not in {stores.looked_at()}{online}; get it with "
        f"`{how}`, or give a path"
    )


def offline() -> bool:
    """huggingface_hub's rule: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set true."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def download(name: str, revision: str | None = None, progress: bool = True) -> Path | None:
    """Download `Org/Repo[:TAG]` at `revision` into the hub cache (the checkpoint folder's files, or the one GGUF file
    the tag picks) and return what it names there; None where the hub has no such repository."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    repo, tag = stores.split_tag(name)
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        info = HfApi(endpoint=endpoint).model_info(repo, revision=revision)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return None
    except (HfHubHTTPError, OSError) as exc:
        raise ModelLoadError(f"model '{name}' is not cached and the hub could not be reached ({exc})") from None
    patterns = _wanted(name, tag, [sibling.rfilename for sibling in info.siblings or []])
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = not progress and not are_progress_bars_disabled()
    if quiet:
        disable_progress_bars()
    try:
        snapshot_download(repo, revision=revision, cache_dir=stores.hub_cache(), allow_patterns=patterns,
                          endpoint=endpoint)  # fmt: skip
    except (HfHubHTTPError, OSError) as exc:
        raise ModelLoadError(f"downloading '{name}' failed ({exc})") from None
    finally:
        if quiet:
            enable_progress_bars()
    return stores.hub_cached(name, revision)


def _wanted(name: str, tag: str | None, files: list[str]) -> list[str]:
    """The files of a repository to fetch for `name`: its one GGUF file the tag (or the default) picks, else the
    checkpoint folder's files."""
    ggufs = [Path(f) for f in files if f.endswith(".gguf") and "mmproj" not in f.lower()]
    folder = "config.json" in files and any(f.endswith(".safetensors") for f in files)
    if ggufs and (tag is not None or not folder):
        chosen = _pick_name(ggufs, tag, stores.split_tag(name)[0])
        return [str(chosen)]
    if not folder:
        raise ModelLoadError(f"'{name}' on the hub is neither a checkpoint folder (config.json, safetensors) nor GGUF")
    return _FOLDER_FILES


def _pick_name(files: list[Path], tag: str | None, label: str) -> Path:
    """The GGUF file among a repository's names that stores.pick would choose."""
    if tag is None and len(files) == 1:
        return files[0]
    wanted = (tag or stores.PREFERRED_QUANT).upper()
    exact = [f for f in files if stores.quant_of(f.name) == wanted]
    loose = [f for f in files if wanted.lower() in f.name.lower()]
    if exact or loose:
        return sorted(exact or loose)[0]
    choices = ", ".join(sorted({f"{label}:{stores.quant_of(f.name) or f.stem}" for f in files}))
    raise ModelLoadError(f"{label} has no GGUF file for the tag '{wanted}': e.g. {choices}")
