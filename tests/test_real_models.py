"""End to end on the bundled Qwen2.5-Coder pair (1.5B target, 0.5B draft), float32.

Marked `real`: they need the [bundled] extra and take a few minutes on a 2-core CPU.
"""

import pytest

from verispec import SpeculativeGenerator, TokenizerMismatchError, load_model

from real_models import humaneval_prompts, require_bundled, smollm2_path

pytestmark = pytest.mark.real
TOKENS = 64


@pytest.fixture(scope="module")
def pair():
    require_bundled()
    return load_model("target", "float32"), load_model("draft", "float32")


def test_greedy_speculative_equals_plain_on_humaneval(pair):
    target, draft = pair
    plain = SpeculativeGenerator(target, None)
    spec = SpeculativeGenerator(target, draft, num_speculative_tokens=4)
    accepted = 0
    for prompt in humaneval_prompts(5):
        expected = plain.generate(prompt, max_tokens=TOKENS)
        got = spec.generate(prompt, max_tokens=TOKENS)
        assert got.token_ids == expected.token_ids, prompt[:60]
        assert len(got.token_ids) == TOKENS or got.finish_reason == "stop"
        accepted += got.stats.accepted
    assert accepted > 0


def test_chat_template_renders_and_generates(pair):
    target, draft = pair
    out = SpeculativeGenerator(target, draft).generate([{"role": "user", "content": "Say hi."}], max_tokens=8)
    assert out.prompt_ids[:2] == target.tokenizer.encode("<|im_start|>system")
    assert out.text


def test_different_tokenizers_are_refused(pair):
    target, _ = pair
    smol = load_model(smollm2_path(), "float32")
    with pytest.raises(TokenizerMismatchError, match="tokenizers differ"):
        SpeculativeGenerator(target, smol)
