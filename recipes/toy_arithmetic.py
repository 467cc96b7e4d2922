"""GRPO at its smallest: a tabular categorical policy learns two sums, on ``grpo_plugin.core.objectives``.

Two prompts, (1, 2) and (2, 3), each with three candidate answers. The policy is a table of
logits (one categorical per prompt) that starts uniform; every step samples the whole group
(all three candidates), scores it with the exact-sum verifier, and takes one SGD step on
``policy_loss`` against a uniform frozen reference. Autograd computes the gradient that a
hand-written tabular implementation would derive in closed form.

    python recipes/toy_arithmetic.py            # prints P(correct) per prompt; exit 1 if < 0.9
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

import torch

from grpo_plugin.core.objectives import LossInputs, group_advantages, objective_name, policy_loss

PROMPTS = [(1, 2), (2, 3)]
ANSWERS = [["3", "4", "2"], ["5", "4", "6"]]
PASS_THRESHOLD = 0.9


def arithmetic_reward(prompt: tuple[int, int], answer: str) -> float:
    """1.0 when ``answer`` is the exact integer sum of the prompt ``(a, b)``, else 0.0."""
    try:
        return float(int(str(answer).strip()) == int(prompt[0] + prompt[1]))
    except ValueError:
        return 0.0


@contextmanager
def single_thread():
    """Tiny tensors: intra-op threads only add overhead (30x on a busy 2-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train_toy_policy(
    steps: int = 80,
    lr: float = 0.4,
    beta: float = 0.03,
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    estimator: str = "grpo",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train the two categorical policies; return ``(probs, rewards)``, both ``(2, 3)``."""
    rewards = torch.tensor(
        [[arithmetic_reward(p, a) for a in row] for p, row in zip(PROMPTS, ANSWERS)],
        dtype=torch.float64,
    )  # (P, G)
    advantages = group_advantages(rewards, estimator=estimator).reshape(-1)  # (P*G,)
    num_prompts, group_size = rewards.shape
    actions = torch.arange(group_size).repeat(num_prompts)  # (N,) every candidate, once
    prompt_of = torch.arange(num_prompts).repeat_interleave(group_size)  # (N,)
    mask = torch.ones(num_prompts * group_size, 1, dtype=torch.float64)  # (N, 1): 1-token answers

    logits = torch.zeros(num_prompts, group_size, dtype=torch.float64, requires_grad=True)
    ref_logps = torch.log_softmax(torch.zeros_like(logits), dim=-1)[prompt_of, actions]  # (N,)
    with single_thread():
        for _ in range(steps):
            logps = torch.log_softmax(logits, dim=-1)[prompt_of, actions].unsqueeze(-1)  # (N, 1)
            loss, _ = policy_loss(
                LossInputs(
                    logps,
                    None,  # on-policy: one update per sampled group
                    ref_logps.unsqueeze(-1),
                    advantages,
                    mask,
                ),
                loss_type=loss_type,
                importance_sampling_level=importance_sampling_level,
                beta=beta,
            )
            (grad,) = torch.autograd.grad(loss, logits)
            with torch.no_grad():  # plain SGD (torch.optim would import torch._dynamo: ~3 s)
                logits -= lr * grad
    return torch.softmax(logits.detach(), dim=-1), rewards


def correct_answer_probabilities(**kwargs) -> list[float]:
    """Probability the trained policy puts on the verified answer, one per prompt."""
    probs, rewards = train_toy_policy(**kwargs)
    return (probs * rewards).sum(dim=-1).tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--lr", type=float, default=0.4)
    parser.add_argument("--beta", type=float, default=0.03)
    parser.add_argument("--loss-type", default="grpo")
    parser.add_argument("--importance-sampling-level", default="token")
    parser.add_argument("--estimator", default="grpo")
    args = parser.parse_args(argv)
    config = {
        "loss_type": args.loss_type,
        "importance_sampling_level": args.importance_sampling_level,
        "estimator": args.estimator,
    }
    probs = correct_answer_probabilities(steps=args.steps, lr=args.lr, beta=args.beta, **config)
    print(f"{objective_name(**config)}: {args.steps} steps, lr {args.lr}, beta {args.beta}")
    for prompt, prob in zip(PROMPTS, probs):
        print(f"prompt {prompt[0]}+{prompt[1]}: P(correct) = {prob:.4f}")
    if min(probs) < PASS_THRESHOLD:
        print(f"FAIL: a prompt is below {PASS_THRESHOLD}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
