"""Prompt datasets for GRPO: generated arithmetic, generated Python functions (`code`), GSM8K,
and any local file with a `prompt` column.

Every dataset is a `datasets.Dataset` whose `prompt` column holds a chat (a list of
`{"role", "content"}` messages) or a plain string, plus whatever columns the reward functions
read (here `answer`, a string; `code`: `tests`, `template` and `entry_point`, see
`code_tasks.py`). Recipes describe their data with one dict, `load_prompt_datasets`
turns it into `(train, eval_or_None)`, and `validate_dataset_spec` checks it without loading
anything heavy (it reads at most the first record of a local file).

Dataset spec keys (all optional except where noted):
    name          "arithmetic" | "code" | "gsm8k" | "humaneval" (an evaluation set: HumanEval's
                  164 problems, `humaneval.py`); omit it for a custom file (then `path` is
                  required)
    path          local .jsonl/.json/.parquet/.csv file, or a Hub dataset id
    split         split to read from `path` (default "train")
    eval_path     held-out data (same formats); default: gsm8k -> same source, split "test"
    eval_split    split to read from `eval_path` (default "test" for Hub ids, else "train")
    train_size    keep the first N training rows (arithmetic default 64, code 256)
    eval_size     keep the first N held-out rows (arithmetic default 64, code 64)
    validation_size  N rows for choosing checkpoints, apart from the held-out test rows
                  (arithmetic: N more distinct pairs; code: N prompts of the validation
                  templates; otherwise the training data's last N rows, kept out of
                  training); see `splits.py`
    seed          arithmetic and code only: the generator's seed
    low, high     arithmetic only: the operand range (inclusive)
    low_b, high_b arithmetic only: the second operand's range (default: low, high)
    operation     arithmetic only: "+" (default) or "*"; `answer` is a + b or a * b
    template      arithmetic only: the question, with {a} and {b}
    system_prompt a system message prepended to arithmetic / code / gsm8k prompts
    shots         messages put between the system message and the question (few-shot turns,
                  e.g. a worked tool call: user, assistant with tool_calls, tool, assistant)
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from datasets import Dataset

from . import code_tasks
from .data_files import (
    LOCAL_SUFFIXES,
    check_json_lines,
    first_record_columns,
    require_file,
    without_bom,
)

ARITHMETIC_TEMPLATE = "What is {a} + {b}?"
OPERATIONS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}
ARITHMETIC_LOW, ARITHMETIC_HIGH = 0, 20  # ~42% greedy baseline for SmolLM2-135M-Instruct
GSM8K_HUB_ID = "openai/gsm8k"
GSM8K_SYSTEM_PROMPT = (
    "Solve the math problem step by step. "
    "End with the final answer on its own line as: #### <number>"
)
BUILTIN_NAMES = ("arithmetic", "code", "gsm8k", "humaneval")
GENERATED_NAMES = ("arithmetic", "code", "humaneval")  # read from no file of the user's
EVALUATION_ONLY = ("humaneval",)  # test sets: `grpo-plugin eval`, never a recipe's training data
_SIZES = {"train_size", "eval_size", "validation_size"}
_COMMON_KEYS = {"name", "path", "split", "eval_path", "eval_split", *_SIZES}
_INTEGER_KEYS = (
    "train_size",
    "eval_size",
    "validation_size",
    "seed",
    "low",
    "high",
    "low_b",
    "high_b",
)
_KEYS_BY_NAME = {
    "arithmetic": {"name", *_INTEGER_KEYS, "template", "system_prompt", "operation", "shots"},
    "code": {"name", *_SIZES, "seed", "system_prompt"},
    "humaneval": {"name", "eval_size", "system_prompt"},
    "gsm8k": _COMMON_KEYS | {"system_prompt", "shots"},
    None: _COMMON_KEYS,
}


def _chat(question: str, system_prompt: str | None, shots: list | None = None) -> list[dict]:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, *(shots or []), {"role": "user", "content": question}]


@dataclass(frozen=True)
class ArithmeticProblems:
    """What `arithmetic_dataset`'s questions look like: "What is a + b?" with a from [low, high]
    and b from [low_b, high_b] (default: the same range)."""

    low: int = ARITHMETIC_LOW  # the first operand's smallest value (inclusive)
    high: int = ARITHMETIC_HIGH  # the first operand's largest value (inclusive)
    low_b: int | None = None  # the second operand's smallest value; None: `low`
    high_b: int | None = None  # the second operand's largest value; None: `high`
    operation: str = "+"  # "+" or "*": the `answer` column is a + b or a * b
    template: str = ARITHMETIC_TEMPLATE  # the question, with {a} and {b}
    system_prompt: str | None = None  # a system message before each question
    shots: list[dict[str, Any]] | None = None  # messages between the system message and question


def arithmetic_dataset(
    n_train: int = 64,
    n_eval: int = 64,
    *,
    seed: int = 0,
    problems: ArithmeticProblems | None = None,
) -> tuple[Dataset, Dataset]:
    """`(train, eval)` chat prompts of `problems` (default `ArithmeticProblems()`: a + b in
    [0, 20]), plus an `answer` column.

    Train and eval pairs are distinct (no (a, b) pair appears in both) and fixed by `seed`;
    `shots` (messages) go between the system message and each question.
    """
    q = problems or ArithmeticProblems()
    low, high, operation, template = q.low, q.high, q.operation, q.template
    low_b, high_b = low if q.low_b is None else q.low_b, high if q.high_b is None else q.high_b
    if low > high or low_b > high_b:
        raise ValueError(f"arithmetic: low={low} must be <= high={high} (and low_b <= high_b)")
    if "{a}" not in template or "{b}" not in template:
        raise ValueError(f"arithmetic: template must contain {{a}} and {{b}}, got {template!r}")
    if operation not in OPERATIONS:
        raise ValueError(f"arithmetic: operation={operation!r}; use one of {', '.join(OPERATIONS)}")
    if template == ARITHMETIC_TEMPLATE and operation != "+":
        template = template.replace("+", operation)
    n_pairs = (high - low + 1) * (high_b - low_b + 1)
    if n_train + n_eval > n_pairs:
        raise ValueError(
            f"arithmetic: {n_train}+{n_eval} prompts need more than the {n_pairs} distinct pairs "
            f"in [{low}, {high}]; widen the range or ask for fewer prompts"
        )
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < n_train + n_eval:
        pair = (rng.randint(low, high), rng.randint(low_b, high_b))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)

    def build(chunk: list[tuple[int, int]]) -> Dataset:
        return Dataset.from_dict(
            {
                "prompt": [
                    _chat(template.format(a=a, b=b), q.system_prompt, q.shots) for a, b in chunk
                ],
                "answer": [str(OPERATIONS[operation](a, b)) for a, b in chunk],
            }
        )

    return build(pairs[:n_train]), build(pairs[n_train:])


def _is_local(path: str) -> bool:
    """A file, not a Hub id: it exists, has a data file's suffix, or is written as a path (from
    `/`, `.` or `~`, with a backslash or two slashes; a Hub id is `org/name`)."""
    as_path = path.startswith(("/", ".", "~")) or "\\" in path or path.count("/") > 1
    return as_path or Path(path).suffix.lower() in LOCAL_SUFFIXES or Path(path).exists()


def _load_table(path_or_hub_id: str, split: str) -> Dataset:
    """A local file (split ignored) or a Hub dataset's split."""
    from datasets import load_dataset

    if _is_local(path_or_hub_id):
        path = Path(path_or_hub_id)
        require_file(path)
        builder = LOCAL_SUFFIXES.get(path.suffix.lower(), "json")
        if path.suffix.lower() == ".jsonl":
            check_json_lines(path)
        try:
            with without_bom(path) as readable:
                return load_dataset(builder, data_files=str(readable), split="train")
        except Exception as err:  # datasets wraps the parser's error in a long traceback
            cause = err.__cause__ or err
            message = " ".join(str(cause).split())[:300]
            raise ValueError(f"{path}: cannot be read as {builder}: {message}") from None
    config = "main" if path_or_hub_id == GSM8K_HUB_ID else None
    return _load_hub_dataset(path_or_hub_id, config, split)


def _load_hub_dataset(hub_id: str, config: str | None, split: str) -> Dataset:
    """A Hub dataset's split; one line, at once, when the Hub cannot be reached and no cached
    copy can be used (`datasets` retried for half a minute, then raised ConnectionError)."""
    from datasets import load_dataset

    from ..models import hub_access

    local = (
        "set its path and eval_path to local files (a recipe: --dataset.path TRAIN.jsonl "
        "--dataset.eval_path TEST.jsonl; grpo-plugin eval: --dataset TEST.jsonl)"
    )
    unreachable = hub_access.unreachable_reason(datasets=True)
    if unreachable and not hub_access.offline(datasets=True):
        raise ValueError(
            f"dataset {hub_id!r} is on the Hugging Face Hub and {unreachable}; {local}, or set "
            "HF_HUB_OFFLINE=1 to use a cached copy."
        )
    try:
        return load_dataset(hub_id, config, split=split)
    except ConnectionError as err:  # offline (or the network failed) and no cached copy
        why = unreachable or f"the Hub failed ({' '.join(str(err).split())[:200]})"
        raise ValueError(
            f"dataset {hub_id!r} is not in the local cache and {why}; {local}, or download it "
            "once with network."
        ) from None


def _take(dataset: Dataset, n: int | None) -> Dataset:
    return dataset if n is None else dataset.select(range(min(n, len(dataset))))


def gsm8k_dataset(
    path_or_hub_id: str = GSM8K_HUB_ID,
    split: str = "train",
    *,
    system_prompt: str | None = GSM8K_SYSTEM_PROMPT,
    n: int | None = None,
    shots: list[dict[str, Any]] | None = None,
) -> Dataset:
    """GSM8K as chat prompts: `question` -> `prompt`; `answer` keeps the "... #### N" solution."""
    table = _take(_load_table(path_or_hub_id, split), n)
    require_columns(table, ["question", "answer"])
    return table.map(
        lambda row: {"prompt": _chat(row["question"], system_prompt, shots)},
        remove_columns=["question"],
    )


def require_columns(dataset: Dataset, required: list[str]) -> None:
    """Raise ValueError naming the missing columns and the ones that exist."""
    missing = [c for c in required if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"dataset is missing column(s) {missing}; it has {dataset.column_names}. "
            "Rename the columns in your data (e.g. with Dataset.rename_column) to match."
        )


def _check_unknown_keys(spec: dict[str, Any], name: str | None) -> None:
    allowed = _KEYS_BY_NAME[name]
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"dataset: unknown key {key!r} for {name or 'a custom file'} dataset.{hint} "
                f"Allowed keys: {', '.join(sorted(allowed))}"
            )


def _check_local_source(path: str, required: list[str]) -> None:
    if not _is_local(path):
        return  # a Hub id: checked when loaded
    file = Path(path)
    require_file(file)
    columns = first_record_columns(file)
    missing = [c for c in required if columns is not None and c not in columns]
    if missing:
        raise ValueError(
            f"dataset file {path!r} lacks column(s) {missing} (it has {columns}); "
            f"add them or rename the existing ones"
        )


def validate_dataset_spec(spec: dict[str, Any]) -> None:
    """Check a dataset spec's keys, files and columns without loading any model or dataset."""
    if not isinstance(spec, dict):
        raise ValueError(
            f"dataset must be a mapping such as {{'name': 'arithmetic'}}, got {spec!r}"
        )
    name = spec.get("name")
    if name is not None and name not in BUILTIN_NAMES:
        close = difflib.get_close_matches(str(name), BUILTIN_NAMES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"dataset: unknown name {name!r}.{hint} Built-in: {', '.join(BUILTIN_NAMES)}; "
            "or omit `name` and give `path` to a file with a `prompt` column"
        )
    _check_unknown_keys(spec, name)
    shots = spec.get("shots", [])
    if not isinstance(shots, list) or not all(isinstance(m, dict) and "role" in m for m in shots):
        raise ValueError("dataset: shots must be a list of messages ({role, content, ...})")
    for key in ("system_prompt", "template", "operation"):
        if key in spec and not isinstance(spec[key], str):
            raise ValueError(f"dataset: {key} must be a string, got {spec[key]!r}")
    for key in _INTEGER_KEYS:
        value = spec.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"dataset: {key} must be an integer, got {value!r}")
    if spec.get("validation_size", 0) < 0:
        raise ValueError("dataset: validation_size must be >= 0 (0: no validation split)")
    if spec.get("train_size", 1) < 1:
        raise ValueError(
            f"dataset: train_size={spec['train_size']} leaves no prompts to train on; give at "
            "least one rollout's prompts (or leave it out: the whole training data)"
        )
    if spec.get("eval_size", 0) < 0:
        raise ValueError(
            f"dataset: eval_size={spec['eval_size']} must be >= 0 (0: no held-out set)"
        )
    if name == "code":
        code_tasks.check_spec_sizes(spec)
    if name in GENERATED_NAMES:
        return
    if name is None and "path" not in spec:
        raise ValueError(
            f"dataset: give `name` ({' | '.join(BUILTIN_NAMES)}) or `path` to a data file"
        )
    required = ["question", "answer"] if name == "gsm8k" else ["prompt"]
    for key in ("path", "eval_path"):
        if key in spec:
            _check_local_source(str(spec[key]), required)


def load_prompt_datasets(spec: dict[str, Any]) -> tuple[Dataset, Dataset | None]:
    """Build `(train, eval_or_None)` from a recipe's dataset spec (see the module docstring)."""
    validate_dataset_spec(spec)
    name = spec.get("name")
    train_size, eval_size = spec.get("train_size"), spec.get("eval_size")
    if name == "arithmetic":
        keys = [f.name for f in fields(ArithmeticProblems)]
        problems = ArithmeticProblems(**{k: spec[k] for k in keys if k in spec})
        n_train = 64 if train_size is None else train_size
        n_eval = 64 if eval_size is None else eval_size
        train, held_out = arithmetic_dataset(
            n_train, n_eval, seed=spec.get("seed", 0), problems=problems
        )
        return train, held_out if len(held_out) else None  # eval_size: 0 means no held-out set
    if name == "code":
        train, held_out, _ = code_tasks.code_splits(spec, 0)  # validation: splits.load_splits
        return train, held_out
    if name == "humaneval":  # an evaluation set: the 164 problems are the held-out split
        from .humaneval import humaneval_dataset

        problems = humaneval_dataset(eval_size, system_prompt=spec.get("system_prompt"))
        return problems.select([]), problems
    if name == "gsm8k":
        return _load_gsm8k(spec, train_size, eval_size)
    train = _take(_load_table(spec["path"], spec.get("split", "train")), train_size)
    require_columns(train, ["prompt"])
    if "eval_path" not in spec:
        return train, None
    eval_split = spec.get("eval_split", "train" if _is_local(spec["eval_path"]) else "test")
    held_out = _take(_load_table(spec["eval_path"], eval_split), eval_size)
    require_columns(held_out, ["prompt"])
    return train, held_out


def _load_gsm8k(
    spec: dict[str, Any], train_size: int | None, eval_size: int | None
) -> tuple[Dataset, Dataset | None]:
    path = spec.get("path", GSM8K_HUB_ID)
    system = spec.get("system_prompt", GSM8K_SYSTEM_PROMPT)
    shots = spec.get("shots")
    train = gsm8k_dataset(
        path, spec.get("split", "train"), system_prompt=system, n=train_size, shots=shots
    )
    eval_path = spec.get("eval_path", None if _is_local(path) else path)
    if eval_path is None:
        return train, None
    eval_split = spec.get("eval_split", "train" if _is_local(eval_path) else "test")
    held_out = gsm8k_dataset(eval_path, eval_split, system_prompt=system, n=eval_size, shots=shots)
    return train, held_out


# ----------------------------------------------------------------------------- describing a spec


def known_columns(spec: dict[str, Any]) -> list[str] | None:
    """The columns a dataset spec yields, known without loading it (None when unknown: Hub ids)."""
    if spec.get("name") == "code":
        return list(code_tasks.COLUMNS)
    if spec.get("name") == "humaneval":
        return ["prompt", "tests", "code_prefix", "task_id", "entry_point"]
    if spec.get("name") in BUILTIN_NAMES:
        return ["prompt", "answer"]
    path = Path(str(spec.get("path", "")))
    return first_record_columns(path) if path.is_file() else None


def has_held_out(spec: dict[str, Any]) -> bool:
    """Whether `load_prompt_datasets(spec)` returns a non-empty held-out set (no loading)."""
    if spec.get("eval_size") == 0:
        return False
    if spec.get("name") in GENERATED_NAMES:
        return True
    if spec.get("name") == "gsm8k" and "eval_path" not in spec:
        return not _is_local(str(spec.get("path", GSM8K_HUB_ID)))
    return "eval_path" in spec


def dataset_label(spec: dict[str, Any]) -> str:
    """How results name the data: the built-in name or the path."""
    return str(spec.get("name") or spec.get("path"))


def dataset_hub_ids(spec: dict[str, Any]) -> list[str]:
    """Hub dataset ids the data came from (for the model card's metadata); [] for local data."""
    path = spec.get("path")
    if spec.get("name") == "gsm8k" and path is None:
        return [GSM8K_HUB_ID]
    if path and not Path(str(path)).exists() and "/" in str(path) and "." not in Path(path).name:
        return [str(path)]
    return []


def parse_dataset_arg(text: str) -> dict[str, Any]:
    """A command-line dataset: a built-in name, a file path, or a YAML mapping `{name: ...}`."""
    if text in BUILTIN_NAMES:
        return {"name": text}
    if text.lstrip().startswith("{"):
        import yaml

        from .yaml_input import safe_load

        try:
            spec = safe_load(text, "--dataset")
        except yaml.YAMLError as err:
            raise ValueError(
                f"--dataset {text!r} is not valid YAML: {' '.join(str(err).split())}"
            ) from None
        if not isinstance(spec, dict):
            raise ValueError(f"--dataset {text!r} is not a mapping")
        return spec
    return {"path": text}
