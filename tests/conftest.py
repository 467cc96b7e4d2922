"""Shared fixtures: a tiny character-level tokenizer and tiny random Llama models (no download)."""

from __future__ import annotations

import contextlib
import json
import os
import string
from pathlib import Path

import pytest
from transformers import TrainerCallback as _TrainerCallback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The embedded model's safetensors copy is cached in the repo (gitignored) so local reruns are fast.
os.environ.setdefault(
    "GRPO_PLUGIN_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "grpo-plugin")
)
# No evaluation result is reused across tests (subprocesses included): a test that reruns a recipe
# sees it evaluated again; tests/evaluation/test_known_results.py turns the store on where it checks it.
os.environ["GRPO_PLUGIN_EVAL_CACHE"] = "off"


def pytest_collection_modifyitems(config, items):
    """`make test-reference` runs the suite with GRPO_PLUGIN_FAST_PATHS=0 (every forward on the
    reference path); a test marked `fast_paths` asserts that a fast path ran, so it is skipped
    there."""
    if os.environ.get("GRPO_PLUGIN_FAST_PATHS", "1") != "0":
        return
    skip = pytest.mark.skip(reason="asserts a fast path; GRPO_PLUGIN_FAST_PATHS=0 turns them off")
    for item in items:
        if "fast_paths" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A recipe run in this process sets torch's thread count (`torch_threads: auto`, process-wide);
    the next test starts from the process's own count again."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


REPO_ROOT = Path(__file__).resolve().parents[1]
# The real GSM8K data lives beside the checkout (../shared), not in the public repository.
GSM8K_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"

# A recipe for `grpo-plugin train` on the `tiny_model_dir` model: 3 steps, LoRA, no checkpoints.
TINY_CLI_RECIPE = """\
model: {model}
dataset: {{name: arithmetic, train_size: 8, eval_size: 4}}
reward_funcs: [last_integer]
eval: {{k: 0}}
num_generations: 4
per_device_train_batch_size: 8
max_steps: 3
max_completion_length: 4
lora: {{r: 4, lora_alpha: 8, target_modules: all-linear}}
save_strategy: "no"
output_dir: {out}
"""

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_tokenizer():
    """A character-level fast tokenizer with a ChatML template; ids 0..4 are special."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    chars = list(string.digits + string.ascii_letters + " +-*/=?.,:;#$%<>()[]{}!'\"\n_")
    vocab = {tok: i for i, tok in enumerate(specials + chars + ["<unk>"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_CORPUS = [
    "What is 12 + 7? The answer is 19.",
    "hello world, hello there",
    "Let's think: 3*4=12",
]


def make_bpe_tokenizer(arch: str):
    """A byte-level BPE fast tokenizer (~300 tokens, trained offline on a few strings) with the
    pre-tokenizer of `arch` ("llama": Llama 3's, "qwen2": Qwen2's), as GGUF export needs."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from grpo_plugin.publish.gguf_vocab import LLAMA3_SPLIT

    split = PRETOKENIZE_REGEX if arch == "qwen2" else LLAMA3_SPLIT
    backend = Tokenizer(models.BPE())
    # Trained on unsplit text, so merges cross word, digit and space boundaries: then the ids
    # depend on the split, and a GGUF naming the wrong pre-tokenizer reads back other ids.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=CHATML_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(BPE_CORPUS * 20, trainer)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tiny_model(
    tokenizer, seed: int = 0, hidden: int = 32, layers: int = 2, initializer_range: float = 0.02
):
    """A tiny random LlamaForCausalLM sized to the tokenizer (fp32).

    Learning tests raise `initializer_range`: at 0.02 the logits of a width-32 model span < 1 nat, so
    an adapter that cannot touch the LM head cannot make any token likely.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    return LlamaForCausalLM(config).eval()


def random_lora_model(**options):
    """The tiny Llama (seed 0) with a LoRA r=4 adapter on every linear layer, B random too
    (`init_lora_weights=False`: every product of the adapter is seen); `options` go to LoraConfig."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = make_tiny_model(make_tiny_tokenizer())
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, **options)
    return get_peft_model(model, config)


def logits_and_grads(model, ids):
    """`model`'s logits on `ids` `(B, T)` and the gradients of a fixed weighted sum of them."""
    import torch

    model.zero_grad()
    logits = model(input_ids=ids).logits  # (B, T, V)
    (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def make_tiny_reward_model(tokenizer, seed: int = 1, hidden: int = 32):
    """A tiny random LlamaForSequenceClassification (one logit) sized to the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=1,
        initializer_range=0.5,  # scores that differ visibly between texts
    )
    return LlamaForSequenceClassification(config).eval()


# ----------------------------------------------------------------------------- tiny trainers

# A synthetic verifiable task for tiny random models: the share of '7' characters.
SEVEN_DATA = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(32)]


def frac_sevens(prompts, completions, completion_ids=None, **kwargs):
    """Synthetic verifiable task: the share of characters that are '7'."""
    return [c.count("7") / max(1, len(c)) for c in completions]


def char_codes(prompts, completions, completion_ids=None, **kwargs):
    """A reward that differs between (almost) any two completions: the mean character code / 128.
    For tests that need a non-zero advantage at the first step, whatever the sampled draws."""
    return [sum(map(ord, c)) / (128 * max(1, len(c))) for c in completions]


def tiny_config(tmp_path, **overrides):
    """A GRPOConfig for 2 quick steps on a tiny model (16 completions = 2 prompts x G=8)."""
    from grpo_plugin import GRPOConfig

    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=8,
        max_steps=2,
        learning_rate=3e-2,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        logging_steps=1,  # tests read each step's log (the default is TRL's 10)
    )
    return GRPOConfig(**{**base, **overrides})


def tiny_lora():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")


def make_trainer(tokenizer, tmp_path, reward=frac_sevens, *, model=None, data=None, peft=None,
                 eval_data=None, init_range=0.02, **overrides):  # fmt: skip
    """A GRPOTrainer on a fresh tiny model (or `model`) with `tiny_config(**overrides)`."""
    from grpo_plugin import GRPOTrainer

    return GRPOTrainer(
        model if model is not None else make_tiny_model(tokenizer, initializer_range=init_range),
        reward,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=SEVEN_DATA if data is None else data,
        eval_dataset=eval_data,
        processing_class=tokenizer,
        peft_config=peft,
    )


class CrashAt(_TrainerCallback):
    """Kills the run (as an exception) when `step` optimizer steps are done."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise SystemExit("simulated crash")


def assert_same_training(a, b, keys=("loss", "reward", "grad_norm")) -> None:
    """Two trainers' runs agree: the logged `keys` at every step (1e-5) and every LoRA weight."""
    import torch

    for row_a, row_b in zip(a.state.log_history, b.state.log_history, strict=True):
        for key in keys:
            if key in row_a:
                assert row_a[key] == pytest.approx(row_b[key], rel=1e-5, abs=1e-7), key
    weights = dict(b.model.named_parameters())
    for name, param in a.model.named_parameters():
        if "lora_" in name:
            torch.testing.assert_close(param, weights[name], rtol=1e-5, atol=1e-6)


def group_batch(prompt_lengths=(7, 3), width=6, real_lengths=None, seed=0, group=3):
    """Left-padded prompts of different lengths, `group` rows each; right-padded completions
    (pad id 0 after each row's end): `(prompt_ids, prompt_mask, completion_ids, completion_mask)`."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    lp = max(prompt_lengths)
    prompts = torch.zeros(len(prompt_lengths), lp, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    for row, length in enumerate(prompt_lengths):
        prompts[row, lp - length :] = torch.randint(5, 90, (length,), generator=gen)
        prompt_mask[row, lp - length :] = 1
    rows = len(prompt_lengths) * group
    completions = torch.randint(5, 90, (rows, width), generator=gen)
    real_lengths = real_lengths or [width - (r % 4) for r in range(rows)]
    completion_mask = (torch.arange(width) < torch.tensor(real_lengths)[:, None]).long()
    return (
        prompts.repeat_interleave(group, 0),
        prompt_mask.repeat_interleave(group, 0),
        completions * completion_mask,
        completion_mask,
    )


_HOLD_LOCK = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, json.dumps({"pid": os.getpid(), "host": "here", "started": "now"}).encode())
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def held_lock(run_dir: Path):
    """Another process holding `run_dir`'s lock, as a run training there does; yields its pid."""
    import subprocess
    import sys

    from grpo_plugin.run.rundir import LOCK_FILE

    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-c", _HOLD_LOCK, str(run_dir / LOCK_FILE)]
    holder = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        (run_dir / LOCK_FILE).unlink(missing_ok=True)  # as a run that ends removes it


def load_script(path: Path, name: str):
    """Import a script that is not in a package (recipes/*.py, benchmarks/*.py) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return make_tiny_model(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny model + tokenizer saved to disk, for code paths that load by path."""
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_model(tiny_tokenizer).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_reward_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny reward model (sequence classifier) + its tokenizer saved to disk."""
    path = tmp_path_factory.mktemp("tiny-reward")
    make_tiny_reward_model(tiny_tokenizer).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------- run dirs

RUN_INFO = {
    "base_model": "test-org/tiny-llama",
    "base_model_path": "/nonexistent/tiny-llama",
    "adapter": True,
    "load_in_4bit": False,
    "objective": {
        "loss_type": "dapo",
        "importance_sampling_level": "token",
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "num_generations": 8,
        "beta": 0.0,
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "num_iterations": 1,
        "dynamic_sampling": False,
    },
    "learning_rate": 2e-4,
    "global_step": 40,
    "max_completion_length": 24,
    "temperature": 1.0,
    "reward_funcs": [{"name": "last_integer", "weight": 1.0}, {"name": "format", "weight": 0.5}],
    "datasets": ["openai/gsm8k"],
    "lora": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"},
    "license": "apache-2.0",
    "grpo_plugin_version": "0.1.0",
}
EVAL = {
    "dataset": "openai/gsm8k",
    "reward": "last_integer",
    "before": {"accuracy": 0.4375, "pass@8": 0.875, "n": 64},
    "after": {"accuracy": 0.71875, "pass@8": 0.90625, "n": 64},
}


def write_run_files(path, run_info=RUN_INFO, evaluation=EVAL, steps=40):
    """grpo_run.json, eval.json and metrics.jsonl (reward climbing 0.21 -> 0.6, eval at step 20)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "grpo_run.json").write_text(json.dumps(run_info))
    if evaluation is not None:
        (path / "eval.json").write_text(json.dumps(evaluation))
    rows = [{"step": s, "reward": 0.2 + 0.01 * s, "kl": 0.0} for s in range(1, steps + 1)]
    rows.insert(20, {"step": 20, "eval_accuracy": 0.5, "eval_n": 64})  # an evaluation's line
    lines = [json.dumps(r) for r in rows] + ['{"step": 41, "rew']  # a truncated last line
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def run_dir(tmp_path):
    """A run dir with hand-written run files and its curve."""
    from grpo_plugin.publish.plot import plot_reward_curve

    path = write_run_files(tmp_path / "run")
    plot_reward_curve(path)
    return path


def pre_admitted(model):
    """Record the training forward's levers as admitted on `model` (engine/levers.py), so that a
    test counting the body's forward calls sees no admission-check forward; returns `model`."""
    from grpo_plugin._compat import unwrap_peft
    from grpo_plugin.engine.forward import decoder_body
    from grpo_plugin.engine.levers import admitted

    body = decoder_body(model)
    for name in ("shared_prompt", "padding_free"):
        admitted(name, body, 0.0)
    admitted("frozen_head", unwrap_peft(model).get_output_embeddings(), 0.0)
    return model
