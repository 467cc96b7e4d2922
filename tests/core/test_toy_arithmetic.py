"""The tiny tabular arithmetic run of recipes/toy_arithmetic.py, on grpo_plugin.core.objectives."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, load_script

RECIPE = REPO_ROOT / "recipes" / "toy_arithmetic.py"


@pytest.fixture(scope="module")
def toy():
    return load_script(RECIPE, "toy_arithmetic")


def test_arithmetic_reward_is_exact_match(toy):
    assert toy.arithmetic_reward((1, 2), "3") == 1.0
    assert toy.arithmetic_reward((1, 2), " 3\n") == 1.0
    assert toy.arithmetic_reward((1, 2), "4") == 0.0
    assert toy.arithmetic_reward((2, 3), "five") == 0.0
    assert toy.arithmetic_reward((2, 3), "5.0") == 0.0


def test_toy_run_learns_the_verified_answer(toy):
    threads = torch.get_num_threads()
    probs = toy.correct_answer_probabilities()
    assert torch.get_num_threads() == threads  # the single-thread speed-up is undone
    assert len(probs) == 2 and min(probs) >= 0.9
    assert toy.correct_answer_probabilities(steps=0) == pytest.approx([1 / 3, 1 / 3])


def numpy_toy_run(steps=80, lr=0.4, beta=0.03) -> np.ndarray:
    """Independent numpy version: on-policy ratio = 1, each of the 6 answers weighted 1/6.

    dL/dlogp(a) = w * (-A_a + beta * (1 - pi_ref(a) / pi(a))); chain through the softmax.
    """
    rewards = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    adv = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + 1e-8)
    logits = np.zeros((2, 3))
    for _ in range(steps):
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        grad_logp = (-adv + beta * (1 - (1 / 3) / probs)) / 6
        logits -= lr * (grad_logp - probs * grad_logp.sum(1, keepdims=True))
    return np.exp(logits) / np.exp(logits).sum(1, keepdims=True)


def test_toy_run_matches_hand_derived_numpy_gradient(toy):
    probs, rewards = toy.train_toy_policy()
    expected = numpy_toy_run()
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-10)
    assert rewards.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]


def test_main_exit_codes_and_output(toy, capsys):
    assert toy.main([]) == 0
    assert "P(correct) = 0.97" in capsys.readouterr().out
    assert toy.main(["--steps", "0"]) == 1  # uniform policy: 1/3 < 0.9
    assert "FAIL" in capsys.readouterr().out


def test_script_runs_standalone():
    result = subprocess.run(
        [sys.executable, str(RECIPE)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("P(correct)") == 2
