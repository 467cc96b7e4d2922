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


def test_an_iterable_train_set_reads_with_one_worker_and_no_dispatch(
    tiny_tokenizer, tmp_path, caplog
):
    with caplog.at_level("WARNING", logger="grpo_plugin.training.sampling.streaming"):
        trainer = make_trainer(tiny_tokenizer, tmp_path, data=stream(), max_steps=1,
                               dataloader_num_workers=2)  # fmt: skip
    assert trainer.args.dataloader_num_workers == 0  # as TRL: the prompt groups stay together
    assert "require `dataloader_num_workers=0`" in caplog.text and "value (2)" in caplog.text
    assert trainer.args.accelerator_config.dispatch_batches is False
    assert trainer.accelerator.dataloader_config.dispatch_batches is False


def test_dispatch_batches_forced_on_is_refused_for_iterable_sets(tiny_tokenizer, tmp_path):
    forced = {"dispatch_batches": True}
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        make_trainer(tiny_tokenizer, tmp_path, data=stream(), max_steps=1,
                     accelerator_config=forced)  # fmt: skip
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        make_trainer(tiny_tokenizer, tmp_path, eval_data={"held": stream()},
                     accelerator_config=forced, eval_strategy="steps", eval_steps=1)  # fmt: skip


def test_an_iterable_eval_set_keeps_the_train_sets_workers(tiny_tokenizer, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="grpo_plugin.training.sampling.streaming"):
        trainer = make_trainer(tiny_tokenizer, tmp_path, eval_data=stream(), max_steps=1,
                               dataloader_num_workers=2, eval_strategy="steps",
                               eval_steps=1)  # fmt: skip
    assert trainer.args.dataloader_num_workers == 2 and "num_workers" not in caplog.text
    assert trainer.args.accelerator_config.dispatch_batches is False
    mapped = make_trainer(tiny_tokenizer, tmp_path / "2", max_steps=1, dataloader_num_workers=2)
    assert mapped.args.accelerator_config.dispatch_batches is None  # map-style: untouched
