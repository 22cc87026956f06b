"""What a checkpoint's configuration is read as (hf_config.py, gguf_config.py, rope.py), and what is refused: a rope
type, field, key or tensor verispec does not compute is refused in one line naming it, never ignored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from verispec import load_model
from verispec.errors import ModelLoadError
from verispec.models.families import config_from_hf
from verispec.models.rope import RopeScaling, inverse_frequencies

FIXTURES = Path(__file__).parent / "fixtures" / "architectures"
LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 1024}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "parameters"),
    [("linear", {"factor": 4.0}),
     ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 64}),
     ("llama3", {"factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                 "original_max_position_embeddings": 256}),
     ("yarn", {"factor": 4.0, "original_max_position_embeddings": 64}),
     ("yarn", {"factor": 8.0, "original_max_position_embeddings": 128, "beta_fast": 16, "beta_slow": 2, "mscale": 0.7,
               "mscale_all_dim": 1.0})],
)  # fmt: skip
def test_the_rotary_frequencies_are_transformers(kind, parameters):
    """Each rope type's frequencies (and yarn's attention factor) as transformers' own functions give them."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": kind, "rope_theta": 10000.0, **parameters}
    expected, attention = ROPE_INIT_FUNCTIONS[kind](LlamaConfig(**{**LLAMA, "rope_parameters": rope}), "cpu")
    _, config = config_from_hf({**LLAMA, "rope_parameters": rope}, "here")
    got = inverse_frequencies(config.rope_theta, config.head_size, config.rope_scaling)
    assert torch.allclose(got.float(), expected, rtol=1e-6, atol=0)
    assert config.rope_scaling.attention_factor == pytest.approx(attention, rel=1e-6)


def test_gguf_rope_frequency_factors_are_llama3s():
    """llama.cpp's converter stores llama3's scaling as per-frequency divisors (rope_freqs): the same frequencies."""
    from verispec.models.gguf_source import GGUFSource

    source = GGUFSource(FIXTURES / "llama3.gguf")
    assert source.config.rope_scaling.type == "factors"
    llama3 = RopeScaling("llama3", factor=8.0, original_max_position_embeddings=16, low_freq_factor=1.0,
                         high_freq_factor=4.0)  # fmt: skip
    expected = inverse_frequencies(source.config.rope_theta, 16, llama3)
    assert torch.allclose(inverse_frequencies(source.config.rope_theta, 16, source.config.rope_scaling), expected,
                          rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "windows", "no_rope"),
    [({"model_type": "gemma3_text", "sliding_window": 512}, (512,) * 5 + (0,), ()),
     ({"model_type": "gemma2", "sliding_window": 4096}, (4096, 0) * 3, ()),
     ({"model_type": "gemma2"}, (4096, 0) * 3, ()),  # transformers' default window
     ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 4},
      (0,) * 4 + (64,) * 2, ()),
     ({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 64}, (), ()),
     ({"model_type": "mistral"}, (4096,) * 6, ()),  # transformers' default window
     ({"model_type": "mistral", "sliding_window": None}, (), ()),
     ({"model_type": "phi3", "sliding_window": 2047}, (2047,) * 6, ()),
     ({"model_type": "smollm3"}, (), (3,)),
     ({"model_type": "smollm3", "no_rope_layers": [1, 0, 1, 1, 0, 1]}, (), (1, 4))],
)  # fmt: skip
def test_windows_and_layers_without_rotary_are_transformers_defaults(fields, windows, no_rope):
    _, config = config_from_hf({**LLAMA, **fields}, "here")
    assert config.layer_windows == windows
    assert config.no_rope_layers == no_rope


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"rope_scaling": {"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}, "rope_type"),
     ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type"),
     ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "llama_4_scaling_beta": 0.1}}, "llama_4_scaling_beta"),
     ({"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
     ({"mlp_bias": True}, "mlp_bias"),
     ({"attention_bias": True}, "attention_bias"),
     ({"hidden_act": "gelu"}, "hidden_act"),
     ({"sliding_window": 128}, "sliding_window"),
     ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
     ({"some_new_option": 3}, "some_new_option"),
     ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "use_bidirectional_attention"),
     ({"model_type": "qwen2", "attn_logit_softcapping": 30.0}, "attn_logit_softcapping"),
     ({"model_type": "falcon"}, "model_type 'falcon'"),
     ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2}, "moe_intermediate_size")],
)  # fmt: skip
def test_config_fields_verispec_does_not_compute_are_refused_naming_them(fields, named):
    with pytest.raises(ModelLoadError, match=named) as error:
        config_from_hf({**LLAMA, **fields}, "here")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("fields", "dense"),
    [({}, ()), ({"mlp_only_layers": [0, 3]}, (0, 3)), ({"decoder_sparse_step": 2}, (0, 2, 4)),
     ({"num_experts": None, "num_local_experts": 8}, ())],
)  # fmt: skip
def test_a_mixtures_layers_are_transformers(fields, dense):
    """Qwen3-MoE: a mixture where (layer + 1) is a multiple of decoder_sparse_step and the layer is not among
    mlp_only_layers; transformers 5 saves num_experts as num_local_experts."""
    moe = {"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    _, config = config_from_hf({**LLAMA, **moe, **fields}, "here")
    assert config.num_experts == 8 and config.experts_per_token == 2 and config.dense_layers == dense
    assert [config.moe(i) for i in range(6)] == [i not in dense for i in range(6)]


def test_fields_that_are_off_or_harmless_are_not_refused():
    harmless = {"mlp_bias": False, "attention_bias": False, "some_new_flag": False, "rope_scaling": None,
                "torch_dtype": "bfloat16", "use_cache": True, "pretraining_tp": 2, "bos_token_id": 1,
                "tie_word_embeddings": True, "architectures": ["LlamaForCausalLM"], "initializer_range": 0.02,
                "attention_dropout": 0.0}  # fmt: skip
    _, config = config_from_hf({**LLAMA, **harmless}, "here")
    assert config.tie_word_embeddings and config.rope_scaling is None


def test_a_tensor_the_loader_would_leave_unread_is_refused(architecture, tmp_path):
    """A bias verispec does not add (Llama's mlp_bias, say, with the config not saying so) refuses the folder."""
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(architecture("llama")[0], tmp_path / "llama")
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.1.mlp.down_proj.bias"] = torch.zeros(64)
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="'model.layers.1.mlp.down_proj.bias' is not read"):
        load_model(folder, "float32", progress=False)


def test_a_multimodal_checkpoints_vision_weights_are_left_unread(architecture):
    """Mistral 3 and Gemma 3 folders hold a vision tower and projector: text prompts never reach them."""
    from verispec.models.families import open_folder

    for name in ("mistral3", "gemma3-vision"):
        source = open_folder(architecture(name)[0])
        assert source.multimodal and any("vision_tower" in key for key in source.index)


def _gguf_copy(source: Path, destination: Path, add: dict, tensors: dict | None = None) -> Path:
    """A copy of a GGUF file with metadata `add` (key -> (value, type)) and extra float32 `tensors`."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(destination, arch)
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture" and name not in add:
            array = field.types[0] == GGUFValueType.ARRAY
            writer.add_key_value(name, field.contents(), field.types[0], field.types[1] if array else None)
    for name, (value, kind) in add.items():
        writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    for name, values in (tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return destination


@pytest.mark.parametrize(
    ("add", "tensors", "named"),
    [({"mistral3.attention.temperature_scale": (0.1, "FLOAT32")}, None, "mistral3.attention.temperature_scale"),
     ({"mistral3.rope.scaling.type": ("longrope", "STRING")}, None, "mistral3.rope.scaling.type"),
     ({"mistral3.rope.scaling.yarn_log_multiplier": (0.1, "FLOAT32")}, None, "yarn_log_multiplier"),
     ({"mistral3.rope.dimension_count": (8, "UINT32")}, None, "rope.dimension_count"),
     ({"mistral3.attention.causal": (False, "BOOL")}, None, "attention.causal"),
     ({"mistral3.pooling_type": (1, "UINT32")}, None, "pooling_type"),
     ({"mistral3.expert_count": (8, "UINT32")}, None, "expert_count"),
     ({"general.architecture": ("gptneox", "STRING")}, None, "architecture 'gptneox'"),
     ({}, {"blk.0.attn_output.bias": np.zeros(32, dtype=np.float32)}, "'blk.0.attn_output.bias' is not read")],
)  # fmt: skip
def test_gguf_keys_and_tensors_verispec_does_not_compute_are_refused_naming_them(add, tensors, named, tmp_path):
    from gguf import GGUFValueType

    from verispec.models.gguf_source import GGUFSource

    typed = {key: (value, GGUFValueType[kind]) for key, (value, kind) in add.items()}
    path = _gguf_copy(FIXTURES / "mistral3.gguf", tmp_path / "changed.gguf", typed, tensors)
    with pytest.raises(ModelLoadError, match=named) as error:
        GGUFSource(path)
    assert "\n" not in str(error.value)


def test_gguf_keys_that_are_off_are_not_refused(tmp_path):
    from gguf import GGUFValueType

    from verispec.models.gguf_source import GGUFSource

    off = {"mistral3.expert_count": (0, GGUFValueType.UINT32), "mistral3.attention.causal": (True, GGUFValueType.BOOL)}
    assert GGUFSource(_gguf_copy(FIXTURES / "mistral3.gguf", tmp_path / "off.gguf", off)).arch == "mistral3"


def test_a_gguf_files_own_sliding_pattern_and_rotary_bases(tmp_path):
    """Gemma 3 from llama.cpp's converter: five local layers of six (their base 100), a linearly scaled global one,
    the 1B-style attention scale and the norms' 1 already added by the converter."""
    from verispec.models.gguf_source import GGUFSource

    config = GGUFSource(FIXTURES / "gemma3.gguf").config
    assert config.layer_windows == (8,) * 5 + (0,)
    assert config.rope_local_theta == 100.0 and config.rope_scaling == RopeScaling("linear", factor=2.0)
    assert config.query_scale == 16**-0.5 and config.norm_offset == 0.0 and config.qk_norm and config.post_norms
    assert [config.rope_table(i) for i in range(6)] == [1] * 5 + [0]
    assert json.loads(config.to_json())["layer_windows"] == [8] * 5 + [0]
    assert type(config).from_json(config.to_json()) == config


def test_a_tokenizer_mismatch_names_the_same_example_token_on_every_run():
    """The example token once came from a dict's iteration order (the Rust vocabulary's): another one each run."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models

    from verispec.errors import TokenizerMismatchError
    from verispec.models.tokenizer import Tokenizer

    def made(order: list[str]) -> Tokenizer:
        vocab = {token: i for i, token in enumerate(order)} | {"<eos>": len(order)}
        return Tokenizer(RawTokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>")), "<eos>")

    target, draft = made(list("abcdefgh")), made(list("abdcefhg"))
    messages = set()
    for _ in range(3):
        with pytest.raises(TokenizerMismatchError) as caught:
            target.check_compatible(draft)
        messages.add(str(caught.value))
    assert len(messages) == 1 and "e.g. 'c': id 3 in the draft, 2 in the target" in messages.pop()
