"""Load a GGUF model onto the native kernels: the weights are the file's own blocks, memory-mapped.

Nothing is converted. The first load reads the file's metadata once (the `gguf` package takes seconds over
a 150k-token vocabulary) and caches what later loads need in a small folder: the model's shape, its
tokenizer, and an index of its tensors (type, shape, offset). That first load also checks every block's
float16 scales (the only fields of a quantized block that can hold NaN or infinity) and refuses a damaged
file naming the tensor. Later loads map the file and build the model in a fraction of a second.

Every family builds the same way (native_blocks.py), unless its entry has a build of its own (family.py:
`native_build`: its blocks on PyTorch with their matrices on the kernels): fused tensors (Phi-3's attn_qkv, its ffn_up
holding gates then ups) become one part of their product, the norms a family adds go to the stack as float32
vectors. `native_from_dense` puts a model loaded with dense weights (a Hugging Face folder) on the same stack.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..errors import ModelLoadError
from ..kernels import native
from ..kernels.linear import GGUFEmbedding, NativeLinear, NativeRMSNorm
from ..kernels.stack import BlockWeights, NativeStack, StackOptions
from . import families
from .config import ModelConfig
from .converted import writing
from .family import Family
from .model import Transformer
from .native_blocks import FLOAT_TYPES, FileTensors, attention_matrices, layer_norms, mlp_matrices
from .tokenizer import Tokenizer

# the cache form (converted.converted_folder); change when the tile formats change (5: T4_1; 6: T2_K, T3_K, T5_K,
# TIQ4_NL, TIQ4_XS)
FORM = "gguf-tiles6"
# per quantized type: (block bytes, offsets of its float16 fields)
_HALF_FIELDS = {
    2: (18, (0,)), 3: (20, (0, 2)), 6: (22, (0,)), 8: (34, (0,)), 20: (18, (0,)),
    10: (84, (80, 82)), 11: (110, (108,)), 12: (144, (0, 2)), 13: (176, (0, 2)), 14: (210, (208,)), 23: (136, (0,)),
}  # fmt: skip


def load_native(
    path: Path, folder: Path, progress: bool = True, coarsen: bool = False
) -> tuple[Transformer, Tokenizer] | None:
    """The model on the native kernels, or None when a matrix has a block type without a kernel.
    `folder`: where the index of this file is cached (see converted.converted_folder). `coarsen`: the layers'
    matrices stored in more bytes per weight than Q4_0 are requantized to Q4_0 once, into the cache (a draft's
    form: `--speculative-quantization q4_0`; the embeddings and the output head stay as stored)."""
    if not (folder / "config.json").is_file():
        _write_index(path, folder, progress, coarsen)
    config = ModelConfig.from_json((folder / "config.json").read_text())
    index = json.loads((folder / "tensors.json").read_text())
    family = families.of_architecture(index["architecture"])
    if _beyond_the_kernels(config) and family.native_build is None:
        return None
    matrices = [entry["type"] for entry in index["tensors"].values() if len(entry["shape"]) > 1]
    if any(qtype not in native.QUANT_TYPES for qtype in matrices):
        return None
    data = {"": np.memmap(path, mode="c")}  # copy-on-write: writable views for torch; the file is never written
    for extra in ("tiles", COARSE):
        if (folder / f"{extra}.bin").is_file() and (folder / f"{extra}.bin").stat().st_size:
            data[extra] = np.memmap(folder / f"{extra}.bin", mode="c")
    native.claim_threads()
    tensors = FileTensors(index, data)
    model = (family.native_build or _build)(config, tensors, family)
    return model, Tokenizer.load_for_gguf(folder, path)


def _build(config: ModelConfig, tensors: FileTensors, family: Family) -> Transformer:
    """A GGUF file's model with its blocks on the native stack."""
    with torch.device("meta"):
        model = Transformer(config)
    state = {"norm.weight": tensors.floats("output_norm.weight")}
    for i, block in enumerate(model.layers):
        attention_matrices(block, tensors, config=config, layer=i, permuted=family.rope_permuted)
        mlp_matrices(block, tensors, config=config, layer=i, fused_gate_up=family.fused_gate_up)
        state |= layer_norms(tensors, config, i)
        if block.attn.wqkv.bias is not None:
            state[f"layers.{i}.attn.wqkv.bias"] = block.attn.wqkv.bias
    embed_type, embed = tensors.raw_rows("token_embd.weight")
    model.embed = GGUFEmbedding(embed_type, embed, config.hidden_size)
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    model.lm_head = tensors.linear([head], config.hidden_size)
    model.load_state_dict(state, assign=True, strict=True)
    return _on_the_stack(model)


def _on_the_stack(model: Transformer) -> Transformer:
    """The model's final norm on the library, and its blocks on the native stack where it takes them."""
    config = model.config
    model.norm = NativeRMSNorm(_folded(model.norm.weight.data, config), config.rms_norm_eps)
    model.fused_blocks = native_stack(config, model)
    if model.fused_blocks is not None:  # its attention reads halves: half the bytes at a long context
        model.kv_dtype = torch.float16
    return model.eval()


def _folded(weight: torch.Tensor | None, config: ModelConfig) -> torch.Tensor | None:
    """A norm's weight as the library takes it: float32, with the config's offset added (Gemma's 1 + w, computed
    in float32 as transformers computes it: the same values)."""
    if weight is None:
        return None
    weight = weight.detach().float()
    return (weight + config.norm_offset if config.norm_offset else weight).contiguous()


def native_stack(config: ModelConfig, model: Transformer) -> NativeStack | None:
    """The native stack over the model's blocks (whose linears are NativeLinear), or None when the head size is
    not a multiple of 8 (the attention's lanes). Each product's activations are quantized in the format its
    parts take (blocks of 32 values, or 256 for the K-quants)."""
    if config.head_size % 8:
        return None

    def norm(module) -> torch.Tensor | None:
        return None if module is None else _folded(module.weight, config)

    def mixture(mlp) -> dict:
        """A block's MLP as the stack takes it: its gate/up and down, or its router and experts."""
        if not hasattr(mlp, "experts"):
            return dict(gate_up=mlp.w_gate_up.parts(), down=mlp.w_down.parts())
        experts = [(x.w_gate_up.parts(), x.w_down.parts()[0]) for x in mlp.experts]
        return dict(gate_up=[], down=[], router=mlp.router.parts()[0], experts=experts)

    blocks = [
        BlockWeights(
            attn_norm=norm(b.attn_norm),
            mlp_norm=norm(b.mlp_norm),
            qkv_bias=None if b.attn.wqkv.bias is None else b.attn.wqkv.bias.data,
            qkv=b.attn.wqkv.parts(),
            o=b.attn.wo.parts(),
            **mixture(b.mlp),
            q_norm=norm(b.attn.q_norm),
            k_norm=norm(b.attn.k_norm),
            post_attn_norm=norm(b.post_attn_norm),
            post_mlp_norm=norm(b.post_mlp_norm),
            rope=config.rope_table(i),
            window=config.window(i),
        )
        for i, b in enumerate(model.layers)
    ]
    embed_scale = model.embedding_scale(torch.float32)
    options = StackOptions(scale=config.query_scale, softcap=config.attn_softcap, gelu=config.activation == "gelu_tanh",
                           embed_scale=0.0 if embed_scale is None else float(embed_scale),
                           experts=config.num_experts, experts_per_token=config.experts_per_token,
                           expert_inter=config.expert_intermediate_size, norm_topk=config.norm_topk_prob)  # fmt: skip
    return NativeStack(hidden=config.hidden_size, heads=config.num_heads, kv_heads=config.num_kv_heads,
                       head_dim=config.head_size, inter=config.intermediate_size, eps=config.rms_norm_eps,
                       blocks=blocks, options=options)  # fmt: skip


DENSE_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}  # GGML type ids


def refuse_unnative(config: ModelConfig, where: str) -> None:
    """ModelLoadError where the native stack lacks a layer the model has (Qwen3.5's linear attention, its gated
    attention and partial rotary)."""
    if config.hybrid or config.attn_output_gate or config.rotary_dim:
        raise ModelLoadError(
            f"{where} has linear-attention layers and a gated, partly rotated attention (Qwen3.5): it runs on PyTorch "
            "(--quantization none), not on the native kernels"
        )
    if _beyond_the_kernels(config):
        parts = ("per-layer head sizes, layers sharing keys and values, per-layer inputs (Gemma 4)" if config.v_norm
                 else "attention sinks, biased experts and a clamped SwiGLU (gpt-oss)")  # fmt: skip
        raise ModelLoadError(
            f"{where} has {parts}: it runs on PyTorch (--quantization none), not on the native kernels"
        )


def _beyond_the_kernels(config: ModelConfig) -> bool:
    """Whether the model has parts no native path computes (gpt-oss's sinks, biased experts, clamped SwiGLU; Gemma 4's
    per-layer head sizes, shared keys and values, per-layer inputs)."""
    gpt_oss = config.attn_sinks or config.o_bias or config.moe_biases or config.activation == "swiglu_oai"
    return gpt_oss or bool(config.layer_head_dims or config.kv_sources or config.per_layer_input_size or config.v_norm)


def linears_on_the_kernels(module: torch.nn.Module, dtype: torch.dtype = torch.float16) -> None:
    """Every nn.Linear inside `module` replaced by a NativeLinear of its weights in `dtype` (a drafter that runs beside
    a target on the native kernels: Gemma 4's assistant), in place."""
    qtype = DENSE_TYPES[dtype]
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            weight = child.weight.detach().to(dtype).contiguous()
            rows = weight.view(torch.uint8).reshape(weight.shape[0], -1)
            bias = None if child.bias is None else child.bias.detach().float()
            setattr(module, name, NativeLinear(child.in_features, [(qtype, rows)], bias))
        else:
            linears_on_the_kernels(child, dtype)


def native_from_dense(model: Transformer, dtype: torch.dtype = torch.float32, coarsen: bool = False) -> Transformer:
    """A PyTorch model with dense weights (a Hugging Face folder loaded unquantized) moved onto the native kernels:
    each matrix as a dense part in `dtype` (float32, float16 or bfloat16: the library's F32, F16, BF16 products
    against float32 activations), the embeddings looked up by the library, the blocks on the native stack. In
    float32 the weights are the checkpoint's own values (tests compare this path with transformers). `coarsen`: the
    layers' matrices whose rows split into 32-weight blocks requantized to Q4_0 instead (a draft's form; the head
    and the embeddings stay dense)."""
    refuse_unnative(model.config, "this model")
    qtype = DENSE_TYPES[dtype]

    def rows_of(weight: torch.Tensor) -> torch.Tensor:
        weight = weight.detach().to(dtype).contiguous()
        return weight.view(torch.uint8).reshape(weight.shape[0], -1)

    def dense(module: torch.nn.Linear, layer: bool = True) -> NativeLinear:
        bias = None if module.bias is None else module.bias.detach().float()
        rows = rows_of(module.weight)
        if coarsen and layer and module.in_features % 32 == 0:
            coarse = native.requantize_q4_0(qtype, rows, torch.arange(rows.shape[0]), module.in_features)
            return NativeLinear(module.in_features, [(native.Q4_0, coarse)], bias)
        return NativeLinear(module.in_features, [(qtype, rows)], bias)

    native.claim_threads()
    for block in model.layers:
        block.attn.wqkv, block.attn.wo = dense(block.attn.wqkv), dense(block.attn.wo)
        for mlp in getattr(block.mlp, "experts", [block.mlp]):
            mlp.w_gate_up, mlp.w_down = dense(mlp.w_gate_up), dense(mlp.w_down)
        if hasattr(block.mlp, "router"):
            block.mlp.router = dense(block.mlp.router)
        block.attn.batch_invariant = True
        block.attn.attend_per_query = native.attention
    embed = rows_of(model.embed.weight)
    hidden = model.config.hidden_size
    model.lm_head = NativeLinear(hidden, [(qtype, embed)]) if model.lm_head is None else dense(model.lm_head, False)
    model.embed = GGUFEmbedding(qtype, embed, hidden)
    return _on_the_stack(model)


def _write_index(path: Path, folder: Path, progress: bool, coarsen: bool = False) -> None:
    from .gguf_source import GGUFSource

    source = GGUFSource(path)
    with writing(folder, path) as tmp, ExitStack() as files:
        coarse = files.enter_context(open(tmp / f"{COARSE}.bin", "wb")) if coarsen else None
        tensors = _write_tiles(path, source, tmp / "tiles.bin", progress, coarse=coarse)
        (tmp / "tensors.json").write_text(json.dumps({"architecture": source.arch, "tensors": tensors}))
        source.write_tokenizer_and_config(tmp)


def _write_tiles(path: Path, source, out: Path, progress: bool, *, coarse=None) -> dict:
    """The index of every tensor, checking each; matrices with a tile form are repacked into `out` (not the
    token embeddings when the file has its own output head: only the lookup reads them, from the GGUF rows).
    `coarse`: an open file the layers' matrices stored wider than Q4_0 are requantized into (_coarsened)."""
    tensors = {}
    untied = any(tensor.name == "output.weight" for tensor in source.reader.tensors)
    bar = tqdm(source.reader.tensors, desc=f"indexing {path.name}", unit="tensor", disable=not progress)
    with open(out, "wb") as tiles, bar:
        for tensor in bar:
            entry = {"type": int(tensor.tensor_type), "shape": [int(d) for d in tensor.shape],
                     "offset": int(tensor.data_offset), "bytes": int(tensor.n_bytes)}  # fmt: skip
            _check_finite(path, tensor.name, entry)
            lookup_only = untied and tensor.name == "token_embd.weight"
            rows = None
            if coarse is not None and _coarsened(entry, tensor.name):
                rows = _requantized(entry, np.array(tensor.data), coarse)
            if len(entry["shape"]) == 2 and not lookup_only and not _rope_permuted(source.family, tensor.name):
                if rows is None:
                    rows = torch.from_numpy(np.array(tensor.data).reshape(entry["shape"][1], -1))  # a writable copy
                tiled = native.repack(entry["type"], rows, entry["shape"][0])
                if tiled is not None:
                    tiles.write(b"\0" * (-tiles.tell() % 64))  # 64-byte aligned
                    entry["tile"] = {"type": tiled[0], "offset": tiles.tell(), "bytes": tiled[1].numel()}
                    tiles.write(tiled[1].numpy().tobytes())
            tensors[tensor.name] = entry
            source.release_pages()
    return tensors


COARSE = "coarse"  # the cached file of requantized rows


def _coarsened(entry: dict, name: str) -> bool:
    """Whether a tensor is requantized to Q4_0 for a coarse draft: a layer's 2-D matrix whose rows split into
    32-weight blocks, stored in more bytes per weight than Q4_0 (Q5_0, Q8_0, Q6_K, F16...). The embeddings stay as
    stored (a lookup reads only one row per token), and so does the output head (the draft's restricted head is
    requantized on its own, draft_head.py)."""
    if not name.startswith("blk.") or len(entry["shape"]) != 2 or entry["type"] not in native.QUANT_TYPES:
        return False
    values, size = native.QUANT_TYPES[entry["type"]]
    q4_values, q4_size = native.QUANT_TYPES[native.Q4_0]
    return size * q4_values > q4_size * values and entry["shape"][0] % q4_values == 0


def _requantized(entry: dict, raw: np.ndarray, coarse) -> torch.Tensor:
    """The tensor's rows requantized to Q4_0, appended to `coarse`; `entry` then points there."""
    k, n = entry["shape"]
    rows = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1))  # F16, F32: their bytes
    q4 = native.requantize_q4_0(entry["type"], rows, torch.arange(n), k)
    coarse.write(b"\0" * (-coarse.tell() % 64))
    entry.update(type=native.Q4_0, file=COARSE, offset=coarse.tell(), bytes=q4.numel(), stored=entry["type"])
    coarse.write(q4.numpy().tobytes())
    return q4


def _rope_permuted(family: Family, name: str) -> bool:
    """Tensors whose rows the loader permutes (their tile form is made after the permutation, at load)."""
    return family.rope_permuted and name.endswith(("attn_q.weight", "attn_k.weight"))


def _check_finite(path: Path, name: str, entry: dict) -> None:
    """A quantized block's integers are always finite: only its float16 scales can be NaN or infinite."""
    data = np.memmap(path, mode="r", offset=entry["offset"], shape=(entry["bytes"],))
    if entry["type"] == 30:  # BF16: NaN or infinite where all 8 exponent bits are set
        finite = not ((data.view(np.uint16) & 0x7F80) == 0x7F80).any()
    elif entry["type"] in FLOAT_TYPES:  # F32, F16: checked in place, no float32 copy
        finite = np.isfinite(data.view(FLOAT_TYPES[entry["type"]])).all()
    elif entry["type"] in _HALF_FIELDS:
        size, offsets = _HALF_FIELDS[entry["type"]]
        blocks = data.reshape(-1, size)
        scales = [blocks[:, o : o + 2].copy().view(np.float16) for o in offsets]
        finite = all(np.isfinite(half).all() for half in scales)
    else:
        return
    if not finite:
        raise ModelLoadError(f"{path}: weight '{name}' holds NaN or infinite values: the model file is damaged")
