"""Sampling noise keyed by (seed, position): what a sampled token is depends on the request's seed, the token's
position and the target's distribution there, never on what was drafted or accepted before.

A sampled token is the winner of an exponential race (equivalent to the Gumbel-max trick): with E_x independent
Exp(1) for every token x, argmax_x p(x) / E_x is a draw from p. The E_x of position t come from a random generator
seeded with (seed, t), so:

- plain decoding draws each token from the target's distribution at its position: the law is the target's;
- a verify pass takes at each row the token the same race gives for that row's position, and accepts a draft while
  it equals that token: every emitted token is the one plain decoding would have drawn there, so the text equals
  plain decoding's for the same seed, whatever drafted it and however much of it was accepted;
- the draft model races its own distribution q against the same E_x ("coupled" drafting), so where q is close to p
  it usually picks the token the target will pick: P(same) approaches sum_x min(p, q), the acceptance of
  Leviathan et al.'s rule.

A request without a seed gets a random one, so every sampled request goes this one way.
"""

from __future__ import annotations

import secrets

import numpy as np
import torch

SEED_MODULUS = 2**64  # seeds are taken modulo 2^64 (SamplingParams allows [-2^63, 2^64))
KEEP_AHEAD = 64  # positions whose noise a sequence keeps cached (a verify pass reaches at most 16 ahead)


def random_seed() -> int:
    return secrets.randbits(64)


class KeyedNoise:
    """The exponentials E_x of each position of one sequence, over `vocab` tokens, drawn once and cached while the
    sequence may still need them."""

    def __init__(self, seed: int, vocab: int):
        self.seed, self.vocab = seed % SEED_MODULUS, vocab
        self._cache: dict[int, torch.Tensor] = {}

    def log_exponentials(self, position: int) -> torch.Tensor:
        """[vocab] float32 log E_x of `position`, E_x ~ Exp(1) (the same on every call, and for every KeyedNoise with
        this seed and vocabulary). E = -log U from uniforms U = (2m + 1) / 2^24 (m a 23-bit random word: the resolution
        of a float32 uniform, and never 0 or 1), so E lies in [6e-8, 16.7]. The logarithm is kept, not E: a draw is
        then one pass over the logits."""
        found = self._cache.get(position)
        if found is None:
            # SeedSequence mixes the two words into PCG64's 128-bit state: distinct (seed, position) keys give
            # independent streams; raw words and two vectorized logs take half the time of numpy's exponentials
            generator = np.random.PCG64(np.random.SeedSequence([self.seed, position]))
            words = generator.random_raw((self.vocab + 1) // 2).view("<u4")[: self.vocab]
            draws = ((words >> 9) * 2 + 1).astype(np.float32)  # odd numbers below 2^24: exact in float32
            draws *= np.float32(2.0**-24)  # U in [2^-24, 1 - 2^-24], never 0 or 1
            np.log(draws, out=draws)
            np.negative(draws, out=draws)  # E = -log U
            found = torch.from_numpy(np.log(draws, out=draws))
            if len(self._cache) >= KEEP_AHEAD:
                for old in sorted(self._cache)[: len(self._cache) - KEEP_AHEAD + 1]:
                    del self._cache[old]
            self._cache[position] = found
        return found

    def race(self, logits: torch.Tensor, temperature: float, position: int) -> int:
        """The token drawn at `position` from softmax(logits / temperature) ([vocab] float32 CPU logits, -inf where
        the filters dropped a token): argmax_x p(x) / E_x = argmax_x (logits_x - temperature * log E_x), one pass
        with no softmax (numpy's argmax: the first maximum, or the first NaN, as torch's, in a tenth of its time).
        Plain decoding, verification and the draft model's coupled race all draw through here."""
        keys = torch.add(logits, self.log_exponentials(position), alpha=-temperature)
        return int(np.argmax(keys.numpy()))

    def choose(self, probs: torch.Tensor, position: int) -> int:
        """The token drawn from `probs` ([vocab]: a distribution given as probabilities) at `position`: the same
        race as `race`, from probabilities (the law tests' form)."""
        return int(np.argmax((probs.log() - self.log_exponentials(position)).numpy()))

    def forget_before(self, position: int) -> None:
        """Positions before `position` are decided: their noise is not needed again."""
        for old in [p for p in self._cache if p < position]:
            del self._cache[old]
