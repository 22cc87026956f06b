"""Defaults the command line, the Python API and the bench share, in one place so that they cannot disagree (and
importable without PyTorch, for argument checks)."""

DEFAULT_MAX_SEQ_LEN = 4096
DEFAULT_DRAFT_VOCAB = 65536  # a restricted draft head (models/draft_head.py); the CLI default, off in the API
# the draft model reads at most this many of a long prompt's last tokens (engine/draft_model.py: draft_view); 0: all
DEFAULT_DRAFT_WINDOW = 64  # measured on public prompts through the server: docs/long-prompts.md
DEFAULT_SUFFIX_CACHE_TOKENS = 1 << 16  # earlier requests' tokens the suffix drafter keeps: ~1.5 KB each in its trie
# --speculative-model's default and the Python API's: the drafter chosen for the target (engine/default_drafter.py)
DEFAULT_DRAFTER = "auto"
