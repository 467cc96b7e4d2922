"""Training on a `datasets.IterableDataset` (a streamed dataset): no length, no random access.

The stream is cut into blocks of P prompts (one rollout) and each block is yielded once per
micro-step that trains on it, which is what `PromptBatchSampler` does for a map-style dataset.
Shuffling is `IterableDataset.shuffle`'s buffered shuffle, reseeded each epoch. The run length
must come from `max_steps`; with several processes each reads its own shard of the stream.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import DataLoader

from ...core.batching import identity_collate

logger = logging.getLogger(__name__)

SHUFFLE_BUFFER = 1000


def is_streamed(dataset: Any) -> bool:
    """True for a `datasets.IterableDataset`."""
    from datasets import IterableDataset

    return isinstance(dataset, IterableDataset)


def stream_columns(dataset: Any) -> list[str]:
    """The column names of a streamed dataset (read from its first row when its features are
    unknown)."""
    columns = getattr(dataset, "column_names", None)
    if columns:
        return list(columns)
    first = next(iter(dataset), None)
    return list(first) if isinstance(first, dict) else []


def check_streamed_training(dataset: Any, args: Any) -> None:
    """What a streamed training set needs: a run length, and no random access."""
    if not is_streamed(dataset):
        return
    if args.max_steps is None or args.max_steps <= 0:
        raise ValueError(
            "train_dataset is an IterableDataset, whose length is unknown: set max_steps (e.g. "
            "max_steps=500) to say how long to train."
        )
    if args.dynamic_sampling:
        raise ValueError(
            "dynamic_sampling draws replacement prompts at random, which a streamed "
            "(IterableDataset) train_dataset cannot do; use a map-style Dataset or turn it off."
        )


def _has_stream(eval_dataset: Any) -> bool:
    if isinstance(eval_dataset, dict):
        return any(is_streamed(d) for d in eval_dataset.values())
    return is_streamed(eval_dataset)


def apply_stream_settings(args: Any, train_dataset: Any, eval_dataset: Any) -> None:
    """TRL's settings for iterable datasets, written onto `args` as TRL does: batches are not
    dispatched from the main process (`accelerator_config.dispatch_batches=False`, refused when
    forced to True), and a streamed train set is read by one worker (`dataloader_num_workers`
    set to 0 with a warning), which keeps each prompt's group together. A streamed eval set
    alone leaves the train set's workers as they are (evaluation here uses no DataLoader)."""
    if not (is_streamed(train_dataset) or _has_stream(eval_dataset)):
        return
    accelerator_config = getattr(args, "accelerator_config", None)
    if accelerator_config is not None:
        if getattr(accelerator_config, "dispatch_batches", None):
            raise ValueError(
                "Iterable datasets require `dispatch_batches=False`, but it is set to `True` in "
                "`accelerator_config`; set accelerator_config={'dispatch_batches': False}."
            )
        accelerator_config.dispatch_batches = False
    if is_streamed(train_dataset) and args.dataloader_num_workers != 0:
        logger.warning(
            "Iterable datasets require `dataloader_num_workers=0` to preserve prompt grouping; "
            "overriding the provided value (%s).",
            args.dataloader_num_workers,
        )
        args.dataloader_num_workers = 0


@contextmanager
def single_worker_for(dataset: Any, args: Any) -> Iterator[None]:
    """Within: `args.dataloader_num_workers` 0 if `dataset` is streamed (TRL's eval loader: workers
    would shard the stream); restored after, so the train loader keeps its workers."""
    workers = args.dataloader_num_workers
    if is_streamed(dataset):
        args.dataloader_num_workers = 0
    try:
        yield
    finally:
        args.dataloader_num_workers = workers


class PromptBlockStream(torch.utils.data.IterableDataset):
    """Blocks (lists) of `prompts_per_batch` rows from `dataset`, each yielded `repeats` times."""

    def __init__(
        self, dataset: Any, prompts_per_batch: int, repeats: int, shuffle: bool, seed: int
    ):
        self.dataset, self.prompts_per_batch, self.repeats = dataset, prompts_per_batch, repeats
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rows(self) -> Any:
        if not self.shuffle:
            return self.dataset
        shuffled = self.dataset.shuffle(seed=self.seed, buffer_size=SHUFFLE_BUFFER)
        shuffled.set_epoch(self.epoch)
        return shuffled

    def __iter__(self) -> Iterator[list[dict]]:
        block: list[dict] = []
        for row in self._rows():
            block.append(row)
            if len(block) == self.prompts_per_batch:
                for _ in range(self.repeats):
                    yield list(block)
                block = []


class _StreamLoader(DataLoader):
    def set_epoch(self, epoch: int) -> None:  # the Trainer calls it at each epoch
        self.dataset.set_epoch(epoch)


def stream_dataloader(dataset: Any, args: Any, rank: int = 0, world_size: int = 1) -> DataLoader:
    """A DataLoader yielding one rollout's prompts per micro-step, each block repeated
    `steps_per_generation * num_iterations` times."""
    if world_size > 1:
        from datasets.distributed import split_dataset_by_node

        dataset = split_dataset_by_node(dataset, rank=rank, world_size=world_size)
    stream = PromptBlockStream(
        dataset,
        args.prompts_per_generation,
        args.steps_per_generation * args.num_iterations,
        args.shuffle_dataset,
        args.seed,
    )
    return _StreamLoader(stream, batch_size=None, collate_fn=identity_collate, num_workers=0)
