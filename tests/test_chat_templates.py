"""verispec's chat-template rendering against transformers' apply_chat_template, on real templates.

The templates are the 70 that llama.cpp keeps in models/templates (Llama 3.1-3.3, Qwen 2.5/3/3.5, QwQ, Gemma 2
and 4, Phi-3.5, Mistral Nemo/Small 3.2/Ministral, DeepSeek R1/V3/V4, gpt-oss, Granite, SmolLM3, Kimi, GLM, ...),
read from the llama.cpp copy under $LLAMACPP_HOME when there is one, else from the copies in
tests/fixtures/templates. Each renders a set of conversations, with and without the generation prompt (verispec
always asks for it), through Tokenizer.render_chat and through a transformers tokenizer holding the same special
tokens; the two texts must be equal, or both must fail (a template refusing a system role), verispec's failure
being InvalidParameterError (a 400, never a server error).

NEEDS_TOOLS lists the templates that render nothing without inputs the server never gives: they loop over
`tools` or `functions` unconditionally, so every conversation fails, in transformers as in verispec.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "templates"
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Hello, who are you?"}
ASSISTANT = {"role": "assistant", "content": "I am a model.\n"}
USER_AGAIN = {"role": "user", "content": "  Say 'héllo' <b>\"twice\"</b> {{ not jinja }} 🙂\n\n"}
CONVERSATIONS = {
    "user": [USER],
    "system+user": [SYSTEM, USER],
    "user/assistant/user": [USER, ASSISTANT, USER_AGAIN],
    "system+user/assistant/user": [SYSTEM, USER, ASSISTANT, USER_AGAIN],
    "user/assistant": [USER, ASSISTANT],
}
NEEDS_TOOLS = {
    "CohereForAI-c4ai-command-r-plus-tool_use",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "fireworks-ai-llama-3-firefunction-v2",
}


def templates_folder() -> Path:
    home = Path(os.environ.get("LLAMACPP_HOME", Path.home() / ".cache" / "llamacpp-native"))
    found = sorted(home.glob("llama_cpp_python-*/vendor/llama.cpp/models/templates"), reverse=True)
    return found[0] if found else FIXTURES


TEMPLATES = sorted(templates_folder().glob("*.jinja"))


@pytest.fixture(scope="module")
def raw():
    """A tiny `tokenizers` tokenizer: the rendering, not the vocabulary, is under test."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import WordLevel

    return RawTokenizer(WordLevel({token: i for i, token in enumerate(SPECIAL.values())}, unk_token="<unk>"))


@pytest.fixture(scope="module")
def reference(raw):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=raw, **SPECIAL)


def _outcome(render) -> tuple[str, str]:
    try:
        return "text", render()
    except Exception as exc:
        return "error", type(exc).__name__


def test_the_templates_are_all_there():
    assert len(TEMPLATES) >= 70 and {path.stem for path in TEMPLATES} >= NEEDS_TOOLS


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda path: path.stem)
def test_verispec_renders_each_conversation_as_transformers_does(path, raw, reference):
    from verispec.errors import InvalidParameterError
    from verispec.models.tokenizer import Tokenizer

    source = path.read_text(encoding="utf-8")
    ours = Tokenizer(raw, SPECIAL["eos_token"], source, (), SPECIAL)
    rendered = 0
    for name, messages in CONVERSATIONS.items():
        for generation_prompt in (True, False):
            expected = _outcome(
                lambda m=messages, g=generation_prompt: reference.apply_chat_template(
                    [dict(message) for message in m], chat_template=source, tokenize=False, add_generation_prompt=g
                )
            )
            got = _outcome(lambda m=messages, g=generation_prompt: ours.render_chat(m, add_generation_prompt=g))
            where = f"{path.stem}, {name}, add_generation_prompt={generation_prompt}"
            if expected[0] == "error":
                assert got == ("error", InvalidParameterError.__name__), f"{where}: transformers fails, verispec {got}"
            else:
                assert got == expected, where
                rendered += 1
    assert (rendered == 0) == (path.stem in NEEDS_TOOLS)
