"""The Trainer's data loaders, as TRL's `GRPOTrainer` builds them (a mixin of `GRPOTrainer`).

Training: each rollout's P prompts (`prompts_per_generation`), shuffled by `PromptBatchSampler`
(whole blocks, one shard per process), the block yielded `steps_per_generation * num_iterations`
times, once per micro-step that trains on it; and, as TRL's `RepeatSampler`, each prompt G times
in a row, so `training_step` receives TRL's P*G rows (`rollout_rows` keeps one per prompt). A
streamed training set goes through `sampling/streaming.py` (P rows per micro-step). Evaluation
here does not use a data loader; `get_eval_dataloader` is the Trainer's for user code, with a
streamed eval set read by one worker, as TRL's.
"""

from __future__ import annotations

from typing import Any

from ..core.batching import PromptBatchSampler, RepeatEach
from .sampling import streaming


class TrainerLoaders:
    """Mixin for `GRPOTrainer`: the train sampler and loaders (see the module docstring)."""

    args: Any
    train_dataset: Any
    eval_dataset: Any

    def _get_train_sampler(self, train_dataset=None) -> RepeatEach:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        a = self.args
        repeats = a.steps_per_generation * a.num_iterations
        # one shard of every rollout's prompts per process (a.world_size of them)
        P, shuffle = a.prompts_per_generation, a.shuffle_dataset
        blocks = PromptBatchSampler(len(dataset), P, repeats, shuffle, a.seed, a.world_size)
        return RepeatEach(blocks, a.num_generations)

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("GRPOTrainer.train() needs a train_dataset with a 'prompt' column.")
        a = self.args
        if streaming.is_streamed(self.train_dataset):
            return streaming.stream_dataloader(self.train_dataset, a, a.process_index, a.world_size)
        return self._get_dataloader(
            dataset=self.train_dataset,
            description="Training",
            batch_size=a.prompts_per_generation * a.num_generations,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def rollout_rows(self, rows: list[dict]) -> list[dict]:
        """The P distinct prompts of a micro-step's rows (the map-style loader repeats each G
        times in a row; a stream's rows come once)."""
        if streaming.is_streamed(self.train_dataset):
            return rows
        return rows[:: self.args.num_generations]

    def get_eval_dataloader(self, eval_dataset=None):
        """The Trainer's (evaluation here does not use it; user code may): a streamed eval set is
        read by one worker, as TRL's, without changing the train loader's workers."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str):  # a name of the dict of eval sets
            dataset = self.eval_dataset[dataset]
        with streaming.single_worker_for(dataset, self.args):
            return super().get_eval_dataloader(eval_dataset)
