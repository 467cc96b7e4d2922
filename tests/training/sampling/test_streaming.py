"""Training on a datasets.IterableDataset with max_steps (a streamed dataset has no length)."""

from __future__ import annotations

import pytest
from conftest import SEVEN_DATA, make_trainer
from datasets import IterableDataset

from grpo_plugin.training.sampling.streaming import PromptBlockStream


def stream(rows=SEVEN_DATA, with_features=True):
    def gen():
        yield from rows

    ds = IterableDataset.from_generator(gen)
    return ds if with_features else ds.map(lambda r: r)


def test_blocks_repeat_once_per_micro_step_and_keep_stream_order():
    rows = [{"prompt": str(i)} for i in range(7)]
    blocks = list(
        PromptBlockStream(stream(rows), prompts_per_batch=3, repeats=2, shuffle=False, seed=0)
    )
    assert [[r["prompt"] for r in b] for b in blocks] == [["0", "1", "2"]] * 2 + [
        ["3", "4", "5"]
    ] * 2


def test_trains_on_an_iterable_dataset_for_max_steps(tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, data=stream(), max_steps=3,
                           gradient_accumulation_steps=2)  # fmt: skip
    seen = []
    original = trainer._sample_and_score
    trainer._sample_and_score = lambda rows, key: (
        seen.append([r["prompt"] for r in rows]) or original(rows, key)
    )
    trainer.train()
    assert trainer.state.global_step == 3
    assert len(seen) == 3 and all(len(p) == 4 for p in seen)  # a rollout (4 prompts x G) per step
    assert len({tuple(p) for p in seen}) == 3  # fresh prompts each rollout


def test_an_iterable_dataset_needs_max_steps(tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="IterableDataset, whose length is unknown: set max_steps"):
        make_trainer(tiny_tokenizer, tmp_path, data=stream(), max_steps=-1)
    with pytest.raises(ValueError, match="no 'prompt' column"):
        make_trainer(tiny_tokenizer, tmp_path, data=stream([{"q": "1"}]), max_steps=1)
