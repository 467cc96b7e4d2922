"""Where sampling randomness comes from: one uniform per completion row per decode step.

The decode loop asks a noise source for the uniforms of the rows it is decoding at step t
(`uniforms(rows, t)`); `sampler.next_tokens` turns each into a token by inverse-CDF.

- `KeyedNoise` (training): the uniforms of prompt p's G rows are drawn from a generator seeded by
  a hash of (seed, rollout, round, p), p being the prompt's position in the GLOBAL batch of that
  rollout. The completions sampled for a prompt therefore depend only on the seed, the rollout
  and that position: not on the other prompts in the batch, on which process samples it, on rows
  leaving the batch as they finish, or on whether the run was resumed from a checkpoint (nothing
  has to be saved to replay them).
- `KeyedNoise.for_evaluation`: the same, keyed on (seed, the prompt's index in the eval set), so
  evaluation samples do not depend on batching or on how the set is sharded over processes.
- `GeneratorNoise`: draws from a `torch.Generator` in call order.
- `ShiftedNoise`: a later turn of a multi-turn rollout: the base draws at each row's position in
  its completion.

`keyed_generator` gives the other keyed draws of a rollout (the dynamic-sampling refill prompts,
the group shuffle) from the same kind of key.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def keyed_generator(*key: int | str) -> torch.Generator:
    """A CPU generator seeded by a stable 63-bit hash of `key` (same key -> same stream)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    seed = struct.unpack("<Q", digest)[0] >> 1
    return torch.Generator().manual_seed(seed)


EVAL_ROLLOUT = -1  # training rollouts count from 0


@dataclass(frozen=True)
class RolloutKey:
    """Names the random draws of one rollout: `round` 0 is the rollout's own prompts, rounds
    1, 2, ... the dynamic-sampling refills."""

    seed: int
    rollout: int
    round: int = 0

    def generator(self, purpose: str) -> torch.Generator:
        """The generator of one named draw of this rollout ("refill", "shuffle", ...)."""
        return keyed_generator(purpose, self.seed, self.rollout, self.round)


class KeyedNoise:
    """Pre-drawn uniforms `(N, T)`: row r reads `table[r, t]` at decode step t."""

    def __init__(self, table: torch.Tensor):
        self.table = table  # (N, T) float32

    @classmethod
    def for_prompts(
        cls, key: RolloutKey, prompt_indices: Sequence[int], group_size: int, max_new_tokens: int
    ) -> KeyedNoise:
        """Uniforms for the groups of the given global prompt indices, in that order.

        A process that samples only a shard of a rollout's prompts passes their global indices
        and gets exactly the draws a single process would use for them.
        """
        groups = []
        for p in prompt_indices:
            gen = keyed_generator("tokens", key.seed, key.rollout, key.round, int(p))
            # (T, G) then transposed: the first t steps' draws do not depend on max_new_tokens
            groups.append(torch.rand(max_new_tokens, group_size, generator=gen).T)
        return cls(torch.cat(groups))  # (P * G, T)

    @classmethod
    def for_evaluation(
        cls, seed: int, prompt_indices: Sequence[int], group_size: int, max_new_tokens: int
    ) -> KeyedNoise:
        """Uniforms for held-out prompts by their index in the eval set (rollout key -1)."""
        key = RolloutKey(seed, EVAL_ROLLOUT)
        return cls.for_prompts(key, prompt_indices, group_size, max_new_tokens)

    def to(self, device: torch.device | str) -> KeyedNoise:
        return KeyedNoise(self.table.to(device))

    def uniforms(self, rows: torch.Tensor, step: int) -> torch.Tensor:
        """`(A,)` uniforms of the decoded rows `rows` `(A,)` at decode step `step`."""
        return self.table[rows, step]


class GeneratorNoise:
    """`len(rows)` fresh uniforms per step from `generator` (the global RNG when None)."""

    def __init__(self, generator: torch.Generator | None):
        self.generator = generator

    def to(self, device: torch.device | str) -> GeneratorNoise:
        return self

    def uniforms(self, rows: torch.Tensor, step: int) -> torch.Tensor:
        gen = self.generator
        gen_device = gen.device if gen is not None else rows.device
        return torch.rand(len(rows), generator=gen, device=gen_device).to(rows.device)


class ShiftedNoise:
    """The draws of `base` for some of its rows, each starting at its own step: a turn after a
    tool call reads the uniforms of the completion positions it fills, so a row's draws depend on
    where its tokens sit in the completion, not on the turn or the other rows decoded with it."""

    def __init__(
        self, base: KeyedNoise | GeneratorNoise, rows: torch.Tensor, offsets: torch.Tensor
    ):
        self.base, self.rows, self.offsets = base, rows, offsets  # (A,), (A,)

    def to(self, device: torch.device | str) -> ShiftedNoise:
        return ShiftedNoise(self.base.to(device), self.rows.to(device), self.offsets.to(device))

    def uniforms(self, rows: torch.Tensor, step: int) -> torch.Tensor:
        """`(a,)` uniforms of the decoded rows `rows` (indices into this subset) at `step`."""
        if isinstance(self.base, KeyedNoise):
            steps = (self.offsets[rows] + step).clamp(max=self.base.table.shape[1] - 1)
            return self.base.table[self.rows[rows], steps]
        return self.base.uniforms(rows, step)


SamplingNoise = KeyedNoise | GeneratorNoise | ShiftedNoise
