"""One pass shape: every pass of a model on PyTorch's kernels run at one padded shape, so that a row's logits are the
same bits whatever the pass's width and whatever its other rows (the rule on a GPU: docs/decisions.md "One pass shape
on a GPU").

Why. A GPU's kernels are chosen by shape: a product of 1 row and one of 5 rows take other tilings (and other splits of
the sum), attention another split over the keys, and in bfloat16 the rounding then differs enough to flip near ties, so
a token verified in a k+1-row pass is not always the token a one-row decode step writes. Run every pass at one shape,
`groups` groups of `width` rows, and every product has the same shape in every pass: a row's result is a function of
its own inputs alone. Attention (shaped_attention.py) reads each row's keys in an order of its own: its older keys in
blocks of positions (as many blocks as the pass's longest row needs, at least one: a block a row does not reach
leaves its bits alone), then its newest positions gathered in chain order, where a token tree's node finds its
ancestors. Prefill chunks take the same shape, so a prompt's keys are the same bits however it was cut (the
scheduler's chunks depend on what else runs), and a sequence prefilled again after preemption gets back the bits it
had.

The layout. A pass's rows are cut into groups of at most `width` consecutive rows of one slot (a long prefill fills
several groups of its slot), and the groups into passes of `groups` groups, in order. Unused rows and groups are
padding: they write into the cache's scratch block and attend to its first row. Every row writes its keys before any
row attends (layer by layer), so a group sees the rows of its slot in earlier groups of the same pass as it sees
earlier passes'.

Static buffers. Every tensor a pass reads is a buffer of the runner, refilled in place per pass (the indices the host
plans in one copy: on a GPU one transfer a pass, not ten); on CUDA the pass is captured as a CUDA graph per (head,
blocks of older keys, tapped layers) and replayed (`graphs`), which removes the ~1,300 kernel launches from Python a
step costs eagerly.

Compiled passes (`compiled`, opt-in). The pass may be compiled by torch.compile, which fuses the attention's and the
norms' small operations into fewer kernels (what a replayed graph still runs one after another). It is compiled by
region: the layers' inputs (once per count of blocks of older keys), an attention layer (once per blocks of older
keys, for every layer alike: a layer reads nothing that tells it from another but its weights and pools) and the head
(once per head), so a 28-layer model compiles in seconds, not minutes. Fused kernels round otherwise than eager ones,
so a model's passes are all compiled or none: a compilation that fails raises, never falls back to eager passes beside
compiled ones.

Fused attention (on CUDA where it runs: `fused_attention`). ShapedPages.attend by one Triton kernel a layer
(kernels/triton_attention.py), which reads the planned indices as they are, where written out it is a dozen kernels;
its bits are not the written-out attention's, so a model's passes take one or the other, decided before the first.
A layer's last residual addition is done by the next layer's region (fused there with its norm where compiled).

A mixture of experts runs each chosen expert over the pass's whole row count (feed_forward.through_experts: the rows
that chose it, then zeros), so that an expert's product has one shape too; which experts run depends on the tokens,
so such a model's passes run eagerly, without graphs.

A hybrid model (Qwen3.5) runs its linear-attention layers on each group's rows in the recurrent form, token by token,
prefills too (a chunked prefill is other arithmetic, and its bits would depend on where the prompt was cut): each row's
state is then the same sequence of operations on its own inputs in every pass, a group's padding rows stepped after its
real ones and forgotten. Its recurrent state lives in Python, so its passes run eagerly, without graphs.

Not covered (`uncovered`; such a model keeps its ordinary passes): the native stack and native attention
(row-invariant already).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InvalidParameterError
from ..kernels import triton_attention
from .kv_cache import KVCache
from .shaped_attention import KEY_BLOCK, RECENT, ShapedPages

log = logging.getLogger("verispec")


@dataclass(frozen=True)
class PassShape:
    groups: int  # groups of rows per pass, each of one cache slot
    width: int  # rows per group

    @property
    def rows(self) -> int:
        return self.groups * self.width

    def __str__(self) -> str:
        return f"{self.groups}x{self.width}"


# on CUDA unless told otherwise: 64 rows, 8 sequences' verify passes of up to 8 rows in one pass. A GPU step reads
# every weight once whatever its rows (T(16)/T(1) was 1.10 on an H200), so padding a one-row step should cost little;
# what 64 rows cost is benchmarks/gpu_costs.py's to measure (docs/speed.md "On a GPU")
CUDA_PASS_SHAPE = PassShape(groups=8, width=8)
MOST_ROWS = 512  # a pass's rows at most: each pass computes every row's logits (a large vocabulary's 0.6 MB a row)


def parse_pass_shape(text: str | None, device: torch.device | str) -> PassShape | None:
    """What `--pass-shape` asks for: "auto" (or None) CUDA_PASS_SHAPE on CUDA and none elsewhere, "off" none, "GxW"
    `G` groups of `W` rows."""
    if text in (None, "auto"):
        return CUDA_PASS_SHAPE if torch.device(device).type == "cuda" else None
    if text == "off":
        return None
    found = re.fullmatch(r"(\d+)x(\d+)", str(text))
    groups, width = (int(found[1]), int(found[2])) if found is not None else (0, 0)
    if min(groups, width) < 1 or groups * width > MOST_ROWS:
        raise InvalidParameterError(
            f"pass shape {text!r}: use auto, off or GROUPSxWIDTH (each at least 1, at most {MOST_ROWS} rows in all), "
            "e.g. 8x8"
        )
    return PassShape(groups=groups, width=width)


def uncovered(model) -> str | None:
    """Why `model` (a Transformer) cannot take one pass shape, or None where it can."""
    if model.fused_blocks is not None or any(getattr(b.attn, "batch_invariant", False) for b in model.layers):
        return "its native kernels are row-invariant already"
    return None


def use_pass_shape(model, shape: PassShape | None, *, asked: bool = False, graphs: bool = True,
                   compiled: bool = False, fused: bool | None = None) -> PassShape | None:  # fmt: skip
    """Every pass of `model` (a Transformer) at `shape` from now on, replayed from CUDA graphs on CUDA where `graphs`,
    compiled by torch.compile where `compiled` (None: its ordinary passes), its attention by one Triton kernel a layer
    where `fused` (None: on CUDA where the kernel runs, unless VERISPEC_FUSED_ATTENTION=0; see `fused_attention`);
    caches made before keep their passes. A model the rule does not cover keeps its ordinary passes, said once in the
    log, or refused where the shape was `asked` for by name; compiled passes are refused without a shape, for a
    mixture of experts and for a hybrid model (their passes run eagerly). Returns the shape taken."""
    reason = uncovered(model) if shape is not None else None
    if compiled and (shape is None or reason is not None):
        why = reason or "no pass shape: --pass-shape GROUPSxWIDTH (auto is none on a CPU)"
        raise InvalidParameterError(f"compiled passes (--compile-passes): not for this model ({why})")
    if reason is not None:
        if asked:
            raise InvalidParameterError(f"pass shape {shape}: not for this model ({reason}); use --pass-shape off")
        log.info("passes at their own shapes: %s", reason)
        shape = None
    mixtures = [m for m in model.modules() if hasattr(m, "padded")]  # feed_forward.through_experts
    eager = bool(mixtures) or model.config.hybrid  # passes that depend on their tokens, or step a state in Python
    if compiled and eager:
        raise InvalidParameterError("compiled passes (--compile-passes): not for this model (a mixture of experts "
                                    "or a hybrid model: its passes run eagerly)")  # fmt: skip
    for mixture in mixtures:
        mixture.padded = shape is not None
    model.pass_shape = shape
    # which experts a pass runs depends on its tokens, a recurrent state steps in Python: such passes run eagerly
    model.pass_graphs = graphs and shape is not None and not eager
    model.pass_compiled = compiled
    model.pass_fused = fused_attention(model, shape, fused)
    return shape


def fused_attention(model, shape: PassShape | None, fused: bool | None) -> bool:
    """Whether `model`'s shaped passes take kernels/triton_attention's attention: never without a shape or where a
    layer's attention is soft-capped (not covered); where `fused` is None, as VERISPEC_FUSED_ATTENTION says: unset, on
    CUDA where the kernel runs (triton_attention.usable); 1, on any device where it runs (a CPU: under Triton's
    interpreter, TRITON_INTERPRET=1); 0, never. Decided before the first pass: the kernel's bits are not the
    written-out attention's, so a model's passes take one or the other."""
    attentions = [block.attn for block in model.layers if not block.linear]
    if shape is None or fused is False or not all(triton_attention.covers(attn) for attn in attentions):
        return False
    if fused:  # asked for by name (the tests)
        return True
    asked = os.environ.get("VERISPEC_FUSED_ATTENTION", "auto").strip().lower() or "auto"
    if asked not in ("auto", "0", "1"):
        raise InvalidParameterError(f"VERISPEC_FUSED_ATTENTION={asked!r}: use 1 (the fused attention wherever it "
                                    "runs), 0 (written out) or auto (on CUDA); unset is auto")  # fmt: skip
    if asked == "0" or (asked == "auto" and model.device.type != "cuda"):
        return False
    sizes = tuple(sorted({attn.head_dim for attn in attentions}))
    return triton_attention.usable(str(model.device), model.dtype, sizes)


# ---- planning: the caller's rows as groups --------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedRow:
    source: int  # the row's index among the caller's rows, flat (batch row x seq + row)
    storage: int  # the cache position it is stored at
    position: int  # its rotary position
    # a token tree's node: where the nodes from its root's child down to itself are stored (a chain's row: ())
    branch: tuple[int, ...] = ()


@dataclass(frozen=True)
class Group:
    slot: int
    rows: list[PlannedRow]


def plan_groups(
    slots: list[int], starts: list[int], offsets: list[list[int]], *, parents: list[list[int]] | None, width: int
) -> list[Group]:
    """The caller's pass (batch row b: slot slots[b], its rows stored from starts[b], at rotary offsets offsets[b],
    its token tree's parents or -1: checked by masks.tree_offsets) as groups of at most `width` consecutive rows of
    one slot."""
    groups = []
    for b, (slot, start, row_offsets) in enumerate(zip(slots, starts, offsets, strict=True)):
        tree = parents[b] if parents is not None else None
        seq = len(row_offsets)
        planned = [_planned(b * seq + i, i, start=start, offset=row_offsets[i], tree=tree) for i in range(seq)]
        groups += [Group(slot, planned[i : i + width]) for i in range(0, seq, width)]
    return groups


def _planned(source: int, i: int, *, start: int, offset: int, tree: list[int] | None) -> PlannedRow:
    storage, position = start + i, start + offset
    if tree is None or tree[i] < 0:  # a chain's row: stored at its position
        return PlannedRow(source=source, storage=storage, position=position)
    path = [i]
    while tree[path[-1]] >= 0:
        path.append(tree[path[-1]])
    return PlannedRow(source=source, storage=storage, position=position,
                      branch=tuple(start + j for j in reversed(path[:-1])))  # fmt: skip


# ---- the runner -----------------------------------------------------------------------------------------------------
class ShapedPasses:
    """A model's passes over one cache at one shape: the static buffers, the fill, the computation (eager, or replayed
    from a CUDA graph)."""

    def __init__(self, model, cache: KVCache, shape: PassShape, graphs: bool, compiled: bool = False,
                 fused: bool = False):  # fmt: skip
        if cache.scratch_block is None:
            raise ValueError("a pass shape needs a cache with a scratch block (Transformer.new_cache makes one)")
        if KEY_BLOCK % cache.block_size:
            raise ValueError(f"a cache block of {cache.block_size} positions does not divide {KEY_BLOCK}")
        self.model, self.cache, self.shape = model, cache, shape
        self.graphs = graphs and cache.device.type == "cuda"
        groups, width, device = shape.groups, shape.width, cache.device
        per = KEY_BLOCK // cache.block_size
        self.read_width = -(-cache.max_blocks // per) * per  # whole key blocks
        self.tokens = torch.zeros(groups, width, dtype=torch.long, device=device)
        # the planned indices, laid end to end in one buffer (one copy from the host a pass); `field` views them
        shapes = {"positions": (groups, width), "older_limit": (groups, width), "write_block": (groups * width,),
                  "write_row": (groups * width,), "read": (groups, self.read_width),
                  "recent_block": (groups, width, RECENT), "recent_row": (groups, width, RECENT),
                  "recent_position": (groups, width, RECENT), "source": (groups * width,),
                  "padding": (groups * width,)}  # fmt: skip
        sizes = [int(np.prod(shape)) for shape in shapes.values()]
        offsets = list(itertools.accumulate(sizes, initial=0))[:-1]
        self._fields = {name: (at, size, shape)
                        for (name, shape), at, size in zip(shapes.items(), offsets, sizes, strict=True)}  # fmt: skip
        self.index = torch.zeros(sum(sizes), dtype=torch.long, device=device)
        self.key_blocks = 0  # blocks of older keys the pass reads
        self.group_slots: list[int] = []  # each real group's slot and its first row's storage (recurrent layers)
        self.group_starts: list[int] = []
        self.rope = model.rope_tables(cache.max_len)
        self._most_kv_heads = max((b.attn.num_kv_heads for b in model.layers if not b.linear), default=1)
        self._captured: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple]] = {}  # by (head, key blocks, tapped)
        self.compiled = compiled
        self.fused = fused  # attention by kernels/triton_attention (model.pass_fused)
        # each layer's last residual addition done by the next layer's region (fused with its norm where compiled: a
        # kernel a layer fewer), where every layer ends with that addition
        self.defers = all(block.defers_residual for block in model.layers)
        # compiled by region (see _compute)
        self._start = _compiled(self._begin) if compiled else self._begin
        self._layer = _compiled(_layer) if compiled else _layer
        self._finish = _compiled(_finish) if compiled else _finish
        self._compiled_for: set[tuple[int, int]] = set()  # (head, key blocks) compiled

    # ---- one pass ----
    def run(self, groups: list[Group], tokens: torch.Tensor, head, tapped: tuple[int, ...] = ()):
        """Each of `groups` (at most the shape's) computed: the hidden states [groups x width, hidden] after the last
        layer, float32 logits [groups x width, V], the inputs of the `tapped` layers; row g x width + i is group g's
        row i."""
        self._fill(groups, tokens)
        self._announce(head)
        if self.graphs:
            captured = self._graph(head, tapped)
            if captured is not None:
                captured[0].replay()
                return captured[1]
        return self._compute(head, tapped)

    def _announce(self, head) -> None:
        """A new kind of pass said in the log: its regions compile at its first run, unless an earlier cache compiled
        them (seconds)."""
        key = (id(head), self.key_blocks)
        if self.compiled and key not in self._compiled_for:
            self._compiled_for.add(key)
            log.info("compiled passes: the %s pass over %d blocks of older keys (compiled at its first run: seconds)",
                     self.shape, self.key_blocks)  # fmt: skip

    def _fill(self, groups: list[Group], tokens: torch.Tensor) -> None:
        """The buffers for `groups` (their rows' tokens picked from the caller's `tokens`, flat). Padding rows write
        into the scratch block and read its first row alone; padding groups read only the scratch block."""
        rows = [(g, i, row) for g, group in enumerate(groups) for i, row in enumerate(group.rows)]
        n, scratch, size = self.shape.rows, self.cache.scratch_block, self.cache.block_size
        flat = np.array([g * self.shape.width + i for g, i, _ in rows], dtype=np.int64)
        slot = np.array([groups[g].slot for g, _, _ in rows], dtype=np.int64)
        storage = np.array([row.storage for *_, row in rows], dtype=np.int64)
        position = np.array([row.position for *_, row in rows], dtype=np.int64)
        table = np.where(self.cache._table < 0, scratch, self.cache._table)
        columns = {name: np.zeros(n, dtype=np.int64) for name in ("source", "position", "older", "row")}
        columns["block"] = np.full(n, scratch, dtype=np.int64)
        columns["source"][flat] = [row.source for *_, row in rows]
        columns["position"][flat], columns["older"][flat] = position, np.maximum(position - RECENT + 1, 0)
        columns["block"][flat], columns["row"][flat] = table[slot, storage // size], storage % size
        recent = np.full((n, RECENT), -1, dtype=np.int64)  # the recent positions' storage; -1: none
        recent[flat] = position[:, None] + np.arange(1 - RECENT, 1)
        for g, i, row in rows:
            if row.branch:  # a tree node: its ancestors below its root's child are where the branch put them
                recent[g * self.shape.width + i, RECENT - len(row.branch) :] = row.branch
        recent_position = np.full((n, RECENT), -1, dtype=np.int64)
        recent_position[:, -1] = 0  # a padding row reads the scratch block's first row: its numbers stay finite
        recent_position[flat] = position[:, None] + np.arange(1 - RECENT, 1)
        row_slot = np.zeros(n, dtype=np.int64)
        row_slot[flat] = slot
        valid = recent >= 0
        recent_block = np.where(valid, table[row_slot[:, None], np.maximum(recent, 0) // size], scratch)
        read = np.full((self.shape.groups, self.read_width), scratch, dtype=np.int64)
        read[: len(groups), : table.shape[1]] = table[[group.slot for group in groups]]
        # at least one block (a block no row reaches leaves every sum as it was: one compilation and graph fewer)
        self.key_blocks = max(1, -(-int(columns["older"].max()) // KEY_BLOCK))
        self.group_slots = [group.slot for group in groups]
        self.group_starts = [group.rows[0].storage for group in groups]
        padding = np.ones(n, dtype=np.int64)
        padding[flat] = 0
        arrays = {"positions": columns["position"], "older_limit": columns["older"], "write_block": columns["block"],
                  "write_row": columns["row"], "read": read, "recent_block": recent_block,
                  "recent_row": np.where(valid, recent % size, 0), "recent_position": recent_position,
                  "source": columns["source"], "padding": padding}  # fmt: skip
        self._copy(tokens, arrays)

    def _copy(self, tokens: torch.Tensor, arrays: dict[str, np.ndarray]) -> None:
        """The host's arrays into the index buffer, in one copy; the rows' tokens picked from the caller's `tokens` on
        their device (a padding row's: 0)."""
        packed = np.concatenate([np.ravel(arrays[name]) for name in self._fields])
        on_device(packed, self.index.device, into=self.index)
        picked = tokens.reshape(-1)[self.field("source").to(tokens.device)]
        self.tokens.view(-1).copy_(picked.masked_fill(self.field("padding").to(tokens.device).bool(), 0))

    def field(self, name: str) -> torch.Tensor:
        """One of the planned indices (a view of the index buffer): positions, older_limit, write_block, write_row,
        read, recent_block, recent_row, recent_position, source, padding."""
        at, size, shape = self._fields[name]
        return self.index[at : at + size].view(shape)

    def _pages(self) -> dict:
        """ShapedPages' tensors: where the pass writes and what each row reads, per window (0: none): older keys at
        positions before the row's `older_limit` (and within the window), recent positions that exist (and within the
        window); the masks say what is hidden. With fused attention, the planned indices the kernel reads."""
        span, size = self.key_blocks * KEY_BLOCK, self.cache.block_size
        written = (self.field("write_block"), slice(None), self.field("write_row"))
        if self.fused:  # the kernel reads the planned indices as they are
            names = ("read", "positions", "older_limit", "recent_block", "recent_row", "recent_position")
            return dict(
                written=written, fused={name: self.field(name) for name in names} | dict(span=span, block_size=size)
            )
        positions, recent_position = self.field("positions"), self.field("recent_position")
        keys = torch.arange(span, device=self.index.device)
        older = {0: keys[None, None, :] >= self.field("older_limit")[:, :, None]}  # True: hidden from the row
        recent = {0: recent_position < 0}
        for window in self.model._windows:
            older[window] = older[0] | (keys[None, None, :] <= positions[:, :, None] - window)
            recent[window] = recent[0] | (recent_position <= positions[:, :, None] - window)
        per = KEY_BLOCK // size
        read = self.field("read")
        older_blocks = [read[:, b * per : (b + 1) * per].repeat_interleave(size, dim=1)
                        for b in range(self.key_blocks)]  # fmt: skip
        return dict(
            written=written,
            older_blocks=older_blocks,
            older_rows=keys[:KEY_BLOCK] % size,
            older=older,
            recent_block=self.field("recent_block"),
            recent_row=self.field("recent_row"),
            recent=recent,
            heads=torch.arange(self._most_kv_heads, device=self.index.device),
        )

    def _begin(self):
        """What the pass's layers read: the first hidden states, the per-layer inputs (or None), the rotary tables
        per table, ShapedPages' tensors."""
        model = self.model
        x = model.embed(self.tokens)
        per_layer = model._per_layer(self.tokens, x)
        scale = model.embedding_scale(x.dtype)
        if scale is not None:
            x = x * scale
        cos_full, sin_full = self.rope
        positions = self.field("positions")
        tables = [
            (cos_full[t][positions][..., :size].to(model.dtype).unsqueeze(2),
             sin_full[t][positions][..., :size].to(model.dtype).unsqueeze(2))
            for t, size in enumerate(model._table_sizes)
        ]  # fmt: skip
        # the residual the layers defer (`defers`): none yet
        pending = torch.zeros_like(x) if self.defers else None
        return x, pending, per_layer, tables, self._pages()

    def _compute(self, head, tapped: tuple[int, ...] = ()):
        """The pass over the buffers: every tensor it reads is one of them, so a CUDA graph can replay it. Compiled
        passes compile it by region (`_begin`, a layer, the head): one compilation serves every layer alike, where a
        whole pass compiled as one took minutes on a 28-layer model."""
        model, cache = self.model, self.cache
        x, pending, per_layer, tables, pages = self._start()
        where, taps = ShapedPages(**pages), {}
        for layer, block in enumerate(model.layers):
            table = model._layer_tables[layer]
            cos, sin = tables[table] if table >= 0 else (None, None)
            if layer in tapped:
                taps[layer] = (x if pending is None else x + pending).reshape(self.shape.rows, -1).clone()
            layer_input = None if per_layer is None else per_layer[:, :, layer]
            if block.linear:  # each real group's rows in the recurrent form, from its slot's state at its start
                x = block(x, cos, sin, None, cache, layer, where, self.group_slots, self.group_starts, True,
                          per_layer=layer_input)  # fmt: skip
            else:
                source = block.attn.source
                x, pending = self._layer(block, x, pending, cos=cos, sin=sin, keys=cache.keys[source],
                                         values=cache.values[source], where=where, per_layer=layer_input)  # fmt: skip
        x, logits = self._finish(model, x, pending, head)
        if len(model.layers) in tapped:
            taps[len(model.layers)] = x.reshape(self.shape.rows, -1).clone()
        return x.reshape(self.shape.rows, -1), logits.reshape(self.shape.rows, -1), taps

    def _graph(self, head, tapped: tuple[int, ...]):
        """The pass captured as a CUDA graph for `head` (None: the model's own), the pass's blocks of older keys and
        its `tapped` layers, once; its outputs (as `_compute`'s) are static tensors each replay overwrites."""
        key = (id(head), self.key_blocks, tapped)
        if key not in self._captured:
            try:
                self._captured[key] = self._capture(head, tapped)
            except RuntimeError:  # a GPU or an op that cannot be captured: the same passes, run eagerly
                log.warning("CUDA graph capture failed; shaped passes run eagerly", exc_info=True)
                self.graphs = False
                return None
        return self._captured[key]

    def _capture(self, head, tapped: tuple[int, ...]):
        """A CUDA graph of the pass over the buffers as they are, and its outputs."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture: lazy initialisations (and compilation) happen here
            for _ in range(2):
                self._compute(head, tapped)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self._compute(head, tapped)
        return graph, outputs


def _layer(block, x, pending, *, cos, sin, keys, values, where: ShapedPages, per_layer):
    """An attention layer of a shaped pass (Block.shaped): a region compiled once for all layers alike. `pending`: the
    last layer's feed-forward output, added here (fused with this layer's norm where compiled), or None; returns the
    hidden states and this layer's feed-forward output where it defers it too (else None)."""
    if pending is not None:
        x = x + pending
    return block.shaped(x, cos, sin, keys=keys, values=values, where=where, per_layer=per_layer,
                        defer=pending is not None)  # fmt: skip


def _finish(model, x, pending, head):
    """The pass's last hidden states (`x` and the `pending` feed-forward output, or None) and their logits."""
    if pending is not None:
        x = x + pending
    return x, model._head(model.norm(x), head)


def _compiled(compute):
    """`compute` compiled for one shape (a compilation per head, count of blocks of older keys, and kind of layer
    where layers differ: the recompilation limits raised). Hitting a limit raises rather than running that pass eagerly
    beside compiled ones, whose bits differ."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 1024)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 8192)
    config.fail_on_recompile_limit_hit = True
    return torch.compile(compute, dynamic=False, fullgraph=True)


def shaped_forward(runner: ShapedPasses, tokens: torch.Tensor, groups: list[Group], *, keep: set[int] | None,
                   head, tapped: tuple[int, ...], after_run=None):  # fmt: skip
    """The caller's pass (`tokens` [batch, seq], planned as `groups`) in passes of the runner's shape, in order:
    the hidden states [batch x seq, hidden] and taps per tapped layer in the caller's row order, and the logits of
    the rows `keep` names (None: every row) in that order. `after_run(groups)` after each pass of the shape."""
    rows = tokens.numel()
    hidden = logits_rows = None
    taps: dict[int, torch.Tensor] = {}
    kept: list[torch.Tensor] = []
    kept_sources: list[int] = []
    for begin in range(0, len(groups), runner.shape.groups):
        chunk = groups[begin : begin + runner.shape.groups]
        x, logits, chunk_taps = runner.run(chunk, tokens, head, tapped)
        if after_run is not None:
            after_run(chunk)
        index = [g * runner.shape.width + i for g, group in enumerate(chunk) for i in range(len(group.rows))]
        sources = [row.source for group in chunk for row in group.rows]
        at, into = on_device(index, x.device), on_device(sources, x.device)
        if hidden is None:
            hidden = x.new_empty(rows, x.shape[-1])
        hidden[into] = x[at]
        for layer, tap in chunk_taps.items():
            taps.setdefault(layer, tap.new_empty(rows, tap.shape[-1]))[into] = tap[at]
        wanted = [n for n, source in enumerate(sources) if keep is None or source in keep]
        kept.append(logits[on_device([index[n] for n in wanted], x.device)])
        kept_sources += [sources[n] for n in wanted]
    order = sorted(range(len(kept_sources)), key=kept_sources.__getitem__)
    logits_rows = torch.cat(kept)[on_device(order, hidden.device)]
    return hidden, logits_rows, taps


def on_device(values, device: torch.device, into: torch.Tensor | None = None) -> torch.Tensor:
    """`values` (a list or an array of integers) as a long tensor on `device`, or copied into `into` (a long tensor
    there, of their size). To a GPU through pinned memory without waiting: a blocking copy would wait for every pass
    queued before it, so the host could not plan the next pass (a draft's next step) while the card runs this one;
    PyTorch's pinned-memory cache keeps the buffer until the copy is done."""
    host = torch.as_tensor(values, dtype=torch.long)
    if device.type == "cuda":
        host = host.pin_memory()
    if into is not None:
        return into.copy_(host, non_blocking=True)
    return host.to(device, non_blocking=True)


def keep_group_ends(recurrent, groups: list[Group]) -> None:
    """Each slot's recurrent state (recurrent_state.py) kept at the end of its last real row among `groups` only: where
    its next group, or the next pass, starts."""
    ends = {group.slot: group.rows[-1].storage + 1 for group in groups}  # a slot's last group wins
    for slot, end in ends.items():
        recurrent.begin(slot, end)


def kept_rows(batch: int, seq: int, num_logits: int | None) -> set[int] | None:
    """The caller's rows whose logits a pass returns: the last `num_logits` of each batch row (None: all)."""
    if num_logits is None:
        return None
    return set(itertools.chain.from_iterable(range(b * seq + seq - num_logits, (b + 1) * seq) for b in range(batch)))
