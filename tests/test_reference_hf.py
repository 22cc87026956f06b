"""The native model against an independent implementation: Hugging Face transformers' own Qwen2 and
Llama code, loading the very same GGUF files (transformers dequantizes them itself).

Tolerance: float32 logits agree to max |diff| < 2e-3 (logit scale ~10-30; the two differ only in
matmul order), and the argmax agrees at every position.
"""

import pytest
import torch

from verispec import load_model
from verispec.models import bundled

from real_models import humaneval_prompts, require_bundled, smollm2_path

pytestmark = [pytest.mark.real, pytest.mark.slow]  # transformers on the real models' float32 weights
ATOL = 2e-3


def _compare(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = load_model(path, "float32")
    hf_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    prompt = humaneval_prompts(1)[0]
    ids = hf_tokenizer.encode(prompt)
    assert ours.tokenizer.encode(prompt) == ids
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0].float()
    got = ours.model(torch.tensor([ids]), ours.model.new_cache(max_len=len(ids)), [0])[0]
    assert got.shape == expected.shape
    assert (got.argmax(-1) == expected.argmax(-1)).all()
    assert (got - expected).abs().max() < ATOL


def test_qwen2_draft_logits_match_transformers():
    require_bundled()
    _compare(bundled.bundled_path("draft"))


def test_llama_smollm2_logits_match_transformers():
    _compare(smollm2_path())
