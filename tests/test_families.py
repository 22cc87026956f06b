"""The table of model families (models/families.py): each file names one family, and what an entry declares its
checkpoints carry is a way of drafting verispec has."""

from __future__ import annotations

from collections import Counter

import pytest

from verispec.engine.methods import method_names
from verispec.errors import ModelLoadError
from verispec.models.families import FAMILIES, config_from_hf, of_architecture


def test_every_model_type_and_architecture_names_one_family():
    kinds = Counter(kind for family in FAMILIES for kind in (*family.model_types, *family.wrappers))
    architectures = Counter(arch for family in FAMILIES for arch in family.architectures)
    assert [kind for kind, n in kinds.items() if n > 1] == []
    assert [arch for arch, n in architectures.items() if n > 1] == []
    assert all(of_architecture(arch).architectures.count(arch) == 1 for arch in architectures)


def test_a_declared_drafter_is_a_registered_method():
    """A chooser of the default way of drafting reads `drafter`: it must name one the engine has."""
    declared = {family.drafter for family in FAMILIES if family.drafter is not None}
    assert declared == {"mtp", "assistant"}
    assert declared <= set(method_names())


def test_a_drafters_own_checkpoint_is_loaded_its_own_way_and_refused_as_a_target():
    """Gemma 4's assistant: its own loader, a refusal naming its method as a target; config_from_hf, which reads
    the targets' config.json, does not take it."""
    (assistant,) = [family for family in FAMILIES if "gemma4_assistant" in family.model_types]
    assert assistant.load_folder is not None and "--speculative-method assistant" in assistant.not_a_target
    with pytest.raises(ModelLoadError, match="model_type 'gemma4_assistant' is not supported"):
        config_from_hf({"model_type": "gemma4_assistant"}, "here")
