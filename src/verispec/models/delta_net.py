"""Qwen3.5's linear attention: a Gated DeltaNet layer over a recurrent state (recurrent_state.py).

Per token t, after a causal depthwise convolution (width `linear_conv_kernel`, SiLU) over the projected queries, keys
and values, with q and k L2-normalised and q scaled by 1 / sqrt(key size), each value head keeps a state S [key size,
value size]:

    S <- exp(g_t) S                       decay: g_t = -exp(A_log) softplus(a_t + dt_bias) <= 0
    u_t = beta_t (v_t - S^T k_t)          the delta rule's correction, beta_t = sigmoid(b_t)
    S <- S + k_t u_t^T
    o_t = S^T q_t

then o is RMS-normalised per head, times its weight and SiLU(z_t), and projected out. Several value heads may share a
key head: value head h reads key head h // (value heads / key heads) in transformers' order, h % key heads in
llama.cpp's (its converter reorders the value heads of every tensor that has them: `linear_heads_tiled`).

Two forms compute the same recurrence:
- `recurrent`: token by token. Decode and verify passes use it: a row's state is its own prefix's whatever else
  the pass holds, and the state after every row is kept (a rejected draft's rollback is a pointer, not a replay).
- `chunked`: chunks of CHUNK tokens, each solved at once through the triangular system the delta rule makes within a
  chunk; prefills use it (only the state after the last token is kept). It is exact algebra, so it differs from the
  recurrent form by float32 rounding only.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import native
from .config import ModelConfig

CHUNK = 64


def l2_normalised(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(|x|^2 + 1e-6) over the last dimension (the epsilon where transformers and FLA put it)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrent(q, k, v, g, beta, state: torch.Tensor, into=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One sequence token by token: q, k [T, heads, key size] (normalised and scaled), v [T, heads, value size], g and
    beta [T, heads], state [heads, key size, value size]. Returns the outputs [T, heads, value size] and the state
    after each token (`state` itself is not written). On a CPU with the native library: its kernel (vsk_delta.c: each
    head through all T tokens in cache, the same algebra), the states written into `into()`'s tensor [T, heads, key
    size, value size] where given (recurrent_state.py's buffers, reused two passes later)."""
    if state.device.type == "cpu" and native.available() and v.shape[-1] <= native.DELTA_MAX_VALUE:
        out, after = native.delta_steps(q, k, v, g=g, beta=beta, state=state, into=into() if into else None)
        return out, list(after.unbind(0))
    outputs, states = [], []
    for t in range(q.shape[0]):
        # S is read once for both S^T k and S^T q (before the decay, which scales both), then written once as
        # exp(g) S + k u^T; the output S'^T q = exp(g) S^T q + (q . k) u needs no second read of it
        decay = g[t].exp()[:, None]  # [heads, 1]
        read = torch.bmm(torch.stack([k[t], q[t]], dim=1), state)  # [heads, 2, value size]
        update = (v[t] - decay * read[:, 0]) * beta[t, :, None]
        state = (state * decay[:, :, None]).baddbmm_(k[t, :, :, None], update[:, None, :])
        outputs.append(decay * read[:, 1] + (q[t] * k[t]).sum(-1, keepdim=True) * update)
        states.append(state)
    return torch.stack(outputs), states


def chunked(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`recurrent`'s outputs and final state, CHUNK tokens at a time. Within a chunk (Γ_t = exp of g's running sum):
    the corrections U solve (I + M) U = beta v - beta Γ K S0 with M[t, j] = beta_t Γ_t / Γ_j (k_t . k_j) for j < t;
    then o_t = Γ_t S0^T q_t + sum_{j <= t} Γ_t / Γ_j (q_t . k_j) u_j and S = Γ_C S0 + sum_j Γ_C / Γ_j k_j u_j^T."""
    out = []
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, T, size]
    g, beta = g.transpose(0, 1), beta.transpose(0, 1)  # [heads, T]
    for begin in range(0, q.shape[1], CHUNK):
        part = slice(begin, begin + CHUNK)
        qc, kc, vc, bc = q[:, part], k[:, part], v[:, part], beta[:, part]
        rising = g[:, part].cumsum(-1)  # log Γ_t
        size = qc.shape[1]
        lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        decay = (rising[:, :, None] - rising[:, None, :]).masked_fill(~lower, float("-inf")).exp()  # Γ_t / Γ_j, j <= t
        system = (bc[:, :, None] * (kc @ kc.transpose(1, 2)) * decay).tril(-1)
        system = system + torch.eye(size, dtype=q.dtype, device=q.device)
        right = bc[:, :, None] * (vc - (kc * rising.exp()[:, :, None]) @ state)
        corrections = torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)
        within = (qc @ kc.transpose(1, 2)) * decay
        out.append((qc * rising.exp()[:, :, None]) @ state + within @ corrections)
        last = rising[:, -1:]
        state = state * last.exp()[:, :, None] + (kc * (last - rising).exp()[:, :, None]).transpose(1, 2) @ corrections
    return torch.cat(out, dim=1).transpose(0, 1), state


class GatedDeltaNet(nn.Module):
    """The token mixer of a Qwen3.5 linear-attention layer. Projections: `w_qkvzba` [q; k; v; z; b; a] in one matrix
    (queries and keys key_heads x key size, values and z value_heads x value size, b and a one per value head)."""

    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        c = config
        self.index = index  # among the linear layers: its place in the recurrent state
        self.key_heads, self.key_dim = c.linear_key_heads, c.linear_key_dim
        self.value_heads, self.value_dim = c.linear_value_heads, c.linear_value_dim
        if not (self.key_heads and self.value_heads and self.value_heads % self.key_heads == 0):
            raise ValueError(f"linear attention of {self.key_heads} key heads and {self.value_heads} value heads")
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        self.split = [2 * keys + values, values, self.value_heads, self.value_heads]
        self.w_qkvzba = nn.Linear(c.hidden_size, sum(self.split), bias=False)
        self.conv = nn.Parameter(torch.zeros(c.linear_conv_dim, c.linear_conv_kernel))  # [channels, width]
        self.dt_bias = nn.Parameter(torch.zeros(self.value_heads))
        self.a_log = nn.Parameter(torch.zeros(self.value_heads))
        self.norm = nn.Parameter(torch.ones(self.value_dim))
        self.eps = c.rms_norm_eps
        self.tiled = c.linear_heads_tiled
        self.out = nn.Linear(values, c.hidden_size, bias=False)
        self.batch_invariant = False  # what Attention has: each row's state is its own whatever the flag

    def forward(self, x: torch.Tensor, states, slots: list[int], starts: list[int], recurrent_form: bool,
                fresh_states: bool = False):  # fmt: skip
        """x [batch, seq, hidden], row b appending to slot slots[b] (its state at length starts[b]). With
        `recurrent_form` every row's state is kept (a rollback can land on any of them), else only the last. Rows
        past the slots' (a shaped pass's padding groups) give zeros. `fresh_states`: the states in tensors of their
        own, not the slot's two buffers in turn (a shaped pass steps a slot's groups one call each: a third group
        would overwrite the first's states, where a rollback may land)."""
        mixed, z, b, a = self.w_qkvzba(x).float().split(self.split, dim=-1)
        beta = b.sigmoid()
        g = -self.a_log.float().exp() * F.softplus(a + self.dt_bias.float())
        rows = []
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            window, state = states.get(slot, self.index, start)
            conv_in = torch.cat([window, mixed[row].T], dim=-1)  # [channels, width - 1 + seq]
            seq, width = x.shape[1], self.conv.shape[1]
            taps = conv_in.unfold(-1, width, 1)  # [channels, seq, width]
            convolved = F.silu((taps * self.conv.float()[:, None, :]).sum(-1)).T  # [seq, channels]
            q, k, v = self._heads(convolved)
            if recurrent_form:
                buffer = None if fresh_states else partial(states.buffer, slot, self.index, seq, state)
                out, after = recurrent(q, k, v, g=g[row], beta=beta[row], state=state, into=buffer)
                windows = [conv_in[:, t + 1 : t + width] for t in range(seq)]
                states.put(slot, self.index, start, windows=windows, states=after)
            else:
                out, final = chunked(q, k, v, g=g[row], beta=beta[row], state=state)
                last = [conv_in[:, seq : seq + width - 1]]
                states.put(slot, self.index, start + seq - 1, windows=last, states=[final])
            rows.append(out)
        if len(rows) < x.shape[0]:
            rows += [torch.zeros_like(rows[0])] * (x.shape[0] - len(rows))
        out = torch.stack(rows)  # [batch, seq, value heads, value size]
        normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm.float()
        gated = normed * F.silu(z.view(*z.shape[:2], self.value_heads, self.value_dim))
        return self.out(gated.flatten(2).to(x.dtype))

    def _heads(self, convolved: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolved channels as q, k (normalised, q scaled, repeated for the value heads that share them) and v."""
        keys = self.key_heads * self.key_dim
        q, k, v = convolved.split([keys, keys, self.value_heads * self.value_dim], dim=-1)
        repeat = self.value_heads // self.key_heads
        q, k = (l2_normalised(t.view(-1, self.key_heads, self.key_dim)) for t in (q, k))
        if self.tiled:
            q, k = q.repeat(1, repeat, 1), k.repeat(1, repeat, 1)
        else:
            q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
        return q * self.key_dim**-0.5, k, v.view(-1, self.value_heads, self.value_dim)
