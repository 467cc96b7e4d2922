"""training/inputs.py's memo: what passed is remembered per dataset object and per tokenizer, so
the second check of the same prompts neither walks nor tokenizes them, and a different tokenizer
or chat template argument is measured afresh."""

from __future__ import annotations

import gc
import logging
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
