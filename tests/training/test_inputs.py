"""training/inputs.py's memo: what passed is remembered per dataset object and per tokenizer, so
the second check of the same prompts neither walks nor tokenizes them, and a different tokenizer
or chat template argument is measured afresh."""

from __future__ import annotations

import gc
import logging
import shutil
import weakref
from types import SimpleNamespace

import pytest
from datasets import Dataset

from grpo_plugin.training import inputs


def args(**overrides):
    base = {"max_completion_length": 8, "max_prompt_length": None, "chat_template_kwargs": None}
    return SimpleNamespace(**{**base, **overrides})


CONFIG = SimpleNamespace(max_position_embeddings=20)  # 12 tokens for a prompt beside 8


@pytest.fixture
def encodes(monkeypatch):
    """The prompts `inputs` tokenizes, in order."""
    seen = []
    real = inputs.encode_prompts

    def counting(tokenizer, prompts, **kwargs):
        seen.extend(prompts)
        return real(tokenizer, prompts, **kwargs)

    monkeypatch.setattr(inputs, "encode_prompts", counting)
    return seen


def test_lengths_are_measured_once_per_dataset_and_tokenizer(tiny_tokenizer, encodes):
    data = Dataset.from_list([{"prompt": "1+1="}, {"prompt": "12+3="}])
    assert inputs.prompt_lengths(data, tiny_tokenizer, None) == [4, 5]  # one token per character
    assert inputs.prompt_lengths(data, tiny_tokenizer, None) == [4, 5]
    assert len(encodes) == 2
    inputs.prompt_lengths(data, tiny_tokenizer, {"enable_thinking": False})  # another key
    assert len(encodes) == 4
    copy = Dataset.from_list([{"prompt": "1+1="}, {"prompt": "12+3="}])  # another object
    inputs.prompt_lengths(copy, tiny_tokenizer, None)
    assert len(encodes) == 6


def test_a_passed_length_check_is_not_repeated_nor_its_warning(tiny_tokenizer, encodes, caplog):
    data = Dataset.from_list([{"prompt": "1" * 15}, {"prompt": "2"}])
    with pytest.raises(ValueError, match="1 of 2 prompts in train are longer than the 12 tokens"):
        inputs.check_prompt_lengths(data, tiny_tokenizer, CONFIG, args(), "train")
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        inputs.check_prompt_lengths(data, tiny_tokenizer, CONFIG, args(max_prompt_length=6), "x")
    assert caplog.text.count("longer than max_prompt_length=6") == 1
    assert len(encodes) == 2  # the refused check measured; the two that passed did not again


def test_a_bad_prompt_is_refused_every_time_and_the_memo_dies_with_its_dataset(tiny_tokenizer):
    bad = Dataset.from_list([{"prompt": "ok"}, {"prompt": " "}])
    for _ in range(2):
        with pytest.raises(ValueError, match="t row 1: the prompt is an empty string"):
            inputs.check_prompts(bad, "t")
    good = Dataset.from_list([{"prompt": "ok"}])
    inputs.check_prompts(good, "t")
    assert inputs._SEEN[good].usable and not inputs._SEEN[bad].usable
    gone = weakref.ref(good)
    del good
    gc.collect()
    assert gone() is None  # the memo held no strong reference to the dataset


def _free(monkeypatch, tmp_path, mb):
    usage = shutil.disk_usage(tmp_path)._replace(free=int(mb * 2**20))
    monkeypatch.setattr(inputs.shutil, "disk_usage", lambda path: usage)


def test_the_free_space_floor_is_sized_from_the_runs_newest_checkpoint(tmp_path, monkeypatch):
    """A resume with 235 MB free and 22 MB checkpoints fits (2 x 22 + margin); 256 MB was a
    fixed floor before. The message names the numbers."""
    out = tmp_path / "run"
    for step, mb in ((5, 90), (10, 22)):  # the newest one counts
        (out / f"checkpoint-{step}").mkdir(parents=True)
        with open(out / f"checkpoint-{step}" / "adapter_model.safetensors", "wb") as f:
            f.truncate(mb * 2**20)  # sparse: the size counts, not the disk
    _free(monkeypatch, tmp_path, 235)
    inputs.check_output_dir(out)
    _free(monkeypatch, tmp_path, 50)
    need = 2 * 22 + inputs.CHECKPOINT_MARGIN_MB
    with pytest.raises(ValueError) as err:
        inputs.check_output_dir(out)
    assert f"(50 MB free, {need} MB needed: 2 x 22 MB for checkpoint-10" in str(err.value)
    _free(monkeypatch, tmp_path, 235)  # a fresh run: the estimate
    with pytest.raises(ValueError, match=rf"235 MB free, {inputs.MIN_FREE_MB} MB needed"):
        inputs.check_output_dir(tmp_path / "fresh")
