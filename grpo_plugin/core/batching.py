"""Prompt sampling and the order of rows in a rollout buffer.

The dataloader yields *distinct prompts*, one rollout's worth (P = generation_batch_size / G) at a
time, and repeats each such batch once per micro-step that trains on it
(`steps_per_generation * num_iterations`). The trainer samples G completions per prompt on the
first repeat and slices its buffer on the others. Unlike TRL's RepeatSampler the G copies of a
prompt are never materialised as dataset rows: the rollout layer prefills each prompt once.

On W processes a rollout's global block of P * W prompts is cut into W shards of P, so every
process samples whole groups for its own prompts and the global set of prompts per step does not
depend on W. The shards are yielded in process order, one dataloader batch each: accelerate's
`BatchSamplerShard` (the default `split_batches=False`) hands batch i to process i mod W, so
process k receives shard k of every block (its prompts are global positions k*P .. k*P + P - 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class PromptBatchSampler(Sampler[int]):
    """Yields shuffled prompt indices in blocks of `prompts_per_batch * num_shards`, each block
    `repeats` times, every repeat as `num_shards` consecutive shards of `prompts_per_batch`.

    Only whole blocks are produced. `set_epoch` reseeds the shuffle, so a resumed run sees the same
    order as the original one (the Trainer skips the batches it already trained on). The order of
    the blocks depends on the seed and the epoch only, not on `num_shards`.
    """

    def __init__(
        self,
        num_rows: int,
        prompts_per_batch: int,
        repeats: int,
        shuffle: bool = True,
        seed: int = 0,
        num_shards: int = 1,
    ):
        block = prompts_per_batch * num_shards
        if num_rows < block:
            on = f" on {num_shards} processes" if num_shards > 1 else ""
            raise ValueError(
                f"The training dataset has {num_rows} prompts but one rollout{on} needs "
                f"{block}; add prompts or lower per_device_train_batch_size."
            )
        self.num_rows, self.prompts_per_batch, self.repeats = num_rows, prompts_per_batch, repeats
        self.num_shards = num_shards
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_rows))
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_rows, generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        order, size = self._order(), self.prompts_per_batch * self.num_shards
        for b in range(self.num_rows // size):
            block = order[b * size : (b + 1) * size]  # shard k is block[k*P : (k+1)*P]
            for _ in range(self.repeats):
                yield from block

    def __len__(self) -> int:
        size = self.prompts_per_batch * self.num_shards
        return (self.num_rows // size) * size * self.repeats


class RepeatEach(Sampler[int]):
    """Each index of `sampler` `times` in a row: TRL's `RepeatSampler` repeats each prompt once
    per completion, so a batch of P prompts is P*G rows, as TRL's trainer hands them to
    `training_step` (the trainer keeps every G-th row)."""

    def __init__(self, sampler: PromptBatchSampler, times: int):
        self.sampler, self.times = sampler, times

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for index in self.sampler:
            yield from [index] * self.times

    def __len__(self) -> int:
        return len(self.sampler) * self.times


def identity_collate(rows: list[dict]) -> list[dict]:
    """Keep dataset rows as a list of dicts: prompts and columns go to rollout and rewards as is."""
    return rows


def shared_group_size(num_generations: int, micro_batch: int) -> int:
    """Rows per block of identical prompts inside any micro-batch slice of a rollout buffer."""
    return math.gcd(num_generations, micro_batch)


def group_permutation(num_rows: int, group_size: int, generator: torch.Generator) -> torch.Tensor:
    """`(num_rows,)` row order that permutes whole groups (blocks of `group_size` rows), keeping
    each group contiguous and in order."""
    perm = torch.randperm(num_rows // group_size, generator=generator)  # (P,)
    return (perm[:, None] * group_size + torch.arange(group_size)).reshape(-1)
