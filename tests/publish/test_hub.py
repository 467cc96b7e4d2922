"""`publish` end to end: the real huggingface_hub client against tests/fake_hub.py via HF_ENDPOINT.

Nothing in huggingface_hub is monkeypatched except two module constants that it reads at import
time and that conftest's environment pins: `HF_HUB_OFFLINE` (conftest sets it) and
`HF_HUB_DISABLE_XET` (the fake server speaks Git LFS, not the Xet protocol). The `--merge` test
runs the CLI in a subprocess configured purely through environment variables.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from conftest import RUN_INFO, held_lock, write_run_files
from fake_hub import start_fake_hub
from huggingface_hub import ModelCard, constants

from grpo_plugin.cli import main
from grpo_plugin.publish.card import write_model_card
from grpo_plugin.publish.hub import (
    HubPublishError,
    PublishOptions,
    merge_adapter,
    publish,
)
from grpo_plugin.publish.plot import plot_reward_curve

TOKEN = "hf_TestTokenDoNotLeak0123456789abcdef"
REPO = "alice/tiny-grpo"
PROMPT = "What is 17 + 25? 42"


def log_probs(model, tokenizer) -> torch.Tensor:
    """Log-prob of each next token of PROMPT: (T-1,)."""
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]  # (1, T)
    with torch.no_grad():
        logits = model(ids).logits.float()  # (1, T, V)
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


def load_base(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_adapter_run(run_dir, base_dir, tokenizer, *, quantized=False):
    """Save a LoRA with perturbed (non-zero) weights plus the run files; return the PeftModel."""
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig

    if quantized:
        from transformers import AutoModelForCausalLM

        bnb = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
        base = AutoModelForCausalLM.from_pretrained(base_dir, quantization_config=bnb)
    else:
        base = load_base(base_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    model.eval().save_pretrained(run_dir)
    tokenizer.save_pretrained(run_dir)
    info = {**RUN_INFO, "base_model_path": str(base_dir), "load_in_4bit": quantized}
    info["lora"] = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
    write_run_files(run_dir, run_info=info)
    (run_dir / "recipe.yaml").write_text("model: tiny\nlearning_rate: 2.0e-4\n")
    (run_dir / "completions").mkdir()
    (run_dir / "completions" / "step_000001.parquet").write_bytes(b"PAR1 fake parquet")
    (run_dir / "checkpoint-20").mkdir()
    (run_dir / "checkpoint-20" / "optimizer.pt").write_bytes(os.urandom(256))
    plot_reward_curve(run_dir)
    write_model_card(run_dir)
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir, tiny_tokenizer):
    run_dir = tmp_path_factory.mktemp("run")
    model = make_adapter_run(run_dir, tiny_model_dir, tiny_tokenizer)
    return run_dir, log_probs(model, tiny_tokenizer)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    hub, server = start_fake_hub(tmp_path / "store")
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    yield hub
    server.shutdown()


def digest_tree(root) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_token_absent(*roots, texts=()) -> None:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                assert TOKEN.encode() not in path.read_bytes(), f"token leaked into {path}"
    for text in texts:
        assert TOKEN not in text


def test_publish_uploads_files_bytes_and_card_in_one_commit(trained, hub, caplog):
    run_dir, _ = trained
    before = digest_tree(run_dir)
    caplog.set_level("DEBUG")
    url = publish(run_dir, REPO, PublishOptions(private=True, commit_message="first upload"))

    assert len(hub.commits) == 1 and hub.commits[0]["summary"] == "first upload"
    assert url == f"{hub.url}/{REPO}/commit/{hub.commits[0]['oid']}"
    assert hub.repos[REPO]["visibility"] == "private"
    stored = hub.repo_dir(REPO)
    tokenizer_files = {p.name for p in run_dir.glob("tokenizer*")}
    tokenizer_files |= {p.name for p in run_dir.glob("*.jinja")}
    tokenizer_files |= {p.name for p in run_dir.glob("special_tokens_map.json")}
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= tokenizer_files
    expected = {"adapter_config.json", "adapter_model.safetensors", "README.md", "reward_curve.png"}
    expected |= {"eval.json", "recipe.yaml"} | tokenizer_files
    assert set(digest_tree(stored)) == expected
    for name in expected - {"README.md"}:
        assert (stored / name).read_bytes() == (run_dir / name).read_bytes(), name
    # binary files went through the LFS upload path
    lfs_puts = [r for r in hub.requests if r.method == "PUT" and r.path.startswith("/lfs-upload/")]
    assert len(lfs_puts) == 2  # adapter_model.safetensors and reward_curve.png
    # every Hub API call carried the token (the LFS PUT goes to storage, unauthenticated, as on S3)
    api_calls = [r for r in hub.requests if r not in lfs_puts]
    assert api_calls and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in api_calls)

    card = ModelCard.load(stored / "README.md")
    assert card.data.base_model == "test-org/tiny-llama"
    assert card.data.library_name == "peft"
    assert {"grpo", "grpo-plugin", "reinforcement-learning", "dapo"} <= set(card.data.tags)
    assert f'PeftModel.from_pretrained(base, "{REPO}")' in card.text

    assert digest_tree(run_dir) == before  # the local output is untouched
    assert_token_absent(run_dir, hub.store, texts=[caplog.text])


def test_adapter_from_server_store_matches_trained_log_probs(
    trained, hub, tiny_model_dir, tiny_tokenizer
):
    from peft import PeftModel

    run_dir, trained_lp = trained
    publish(run_dir, REPO)
    reloaded = PeftModel.from_pretrained(load_base(tiny_model_dir), str(hub.repo_dir(REPO))).eval()
    reloaded_lp = log_probs(reloaded, tiny_tokenizer)
    base_lp = log_probs(load_base(tiny_model_dir), tiny_tokenizer)
    assert (trained_lp - base_lp).abs().max() > 1e-2  # the adapter really changes the model
    torch.testing.assert_close(reloaded_lp, trained_lp, atol=1e-5, rtol=0)


def test_card_snippet_runs_on_the_uploaded_repo(trained, hub, tiny_model_dir):
    run_dir, _ = trained
    publish(run_dir, REPO)
    card = ModelCard.load(hub.repo_dir(REPO) / "README.md")
    snippet = re.search(r"```python\n(.*?)```", card.text, re.S).group(1)
    snippet = snippet.replace(f'"{REPO}"', repr(str(hub.repo_dir(REPO))))
    snippet = snippet.replace('"test-org/tiny-llama"', repr(str(tiny_model_dir)))
    snippet = snippet.replace("print(", "decoded = (")
    scope: dict = {}
    exec(snippet, scope)  # loads base + adapter from the store and generates 24 tokens
    assert isinstance(scope["decoded"], str)
    assert scope["output"].shape[1] > scope["inputs"]["input_ids"].shape[1]


def test_merge_cli_uploads_full_weights_equal_to_base_plus_adapter(
    trained, hub, tiny_model_dir, tiny_tokenizer
):
    run_dir, trained_lp = trained
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1"}
    env["HF_HUB_OFFLINE"] = "0"
    command = [
        sys.executable,
        "-m",
        "grpo_plugin",
        "publish",
        str(run_dir),
        "--repo-id",
        "alice/merged",
    ]
    done = subprocess.run(
        [*command, "--merge", "--revision", "dev"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Published to" in done.stdout
    assert hub.commits[-1]["revision"] == "dev"
    stored = hub.repo_dir("alice/merged", "dev")
    files = set(digest_tree(stored))
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json"} <= files
    assert not files & {"adapter_config.json", "adapter_model.safetensors"}
    card = ModelCard.load(stored / "README.md")
    assert card.data.library_name == "transformers"
    merged_lp = log_probs(load_base(stored), tiny_tokenizer)
    torch.testing.assert_close(merged_lp, trained_lp, atol=1e-4, rtol=0)
    assert_token_absent(run_dir, hub.store, texts=[done.stdout, done.stderr])


def test_merge_of_an_adapter_trained_on_a_4bit_base(tmp_path, tiny_model_dir, tiny_tokenizer):
    from peft import PeftModel

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    make_adapter_run(run_dir, tiny_model_dir, tiny_tokenizer, quantized=True)
    merged = load_base(merge_adapter(run_dir, tmp_path / "merged"))
    assert "quantization_config" not in json.loads(
        (tmp_path / "merged" / "config.json").read_text()
    )
    reference = PeftModel.from_pretrained(load_base(tiny_model_dir), str(run_dir)).eval()
    torch.testing.assert_close(
        log_probs(merged, tiny_tokenizer), log_probs(reference, tiny_tokenizer), atol=1e-4, rtol=0
    )


def test_checkpoints_and_completions_only_when_asked(trained, hub):
    run_dir, _ = trained
    publish(run_dir, REPO, PublishOptions(include_checkpoints=True, include_completions=True))
    files = set(digest_tree(hub.repo_dir(REPO)))
    assert {"checkpoint-20/optimizer.pt", "completions/step_000001.parquet"} <= files
    assert not files & {"grpo_run.json", "metrics.jsonl"}


def test_no_token_says_how_to_log_in(trained, hub, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ValueError, match="hf auth login"):
        publish(trained[0], REPO)
    assert hub.requests == []


def test_a_run_file_that_holds_the_token_is_never_uploaded(tmp_path, trained, hub):
    run_dir = tmp_path / "run"
    shutil.copytree(trained[0], run_dir)
    (run_dir / "recipe.yaml").write_text(f"# The recipe as run\nhub_token: {TOKEN}\n")
    with pytest.raises(ValueError, match=r"recipe.yaml holds your Hugging Face token"):
        publish(run_dir, REPO)
    assert hub.commits == [] and not hub.repo_dir(REPO).exists()


def test_repo_id_without_namespace(trained, hub, capsys):
    with pytest.raises(ValueError, match="needs a namespace.*USER/NAME"):
        publish(trained[0], "tiny-grpo")
    assert main(["publish", str(trained[0]), "--repo-id", "tiny-grpo"]) == 2  # bad input
    err = capsys.readouterr().err
    assert err.startswith("error: Repo id 'tiny-grpo' needs a namespace") and err.count("\n") == 1
    assert hub.requests == []


def test_dir_without_adapter_or_model_says_what_is_missing(tmp_path, hub, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="missing adapter_model.safetensors"):
        publish(tmp_path, REPO)
    assert hub.requests == []


def test_a_run_still_training_is_refused_before_anything_uploads(trained, hub, capsys):
    """Issue 56: publish on a live run uploaded its folder as it was (an older step's weights)."""
    run_dir, _ = trained
    with held_lock(run_dir) as pid:
        with pytest.raises(ValueError, match=rf"is still training \(pid {pid} on here"):
            publish(run_dir, REPO)
        assert main(["publish", str(run_dir), "--repo-id", REPO]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir} is still training") and err.count("\n") == 1
    assert "wait for it to finish, then publish it" in err
    assert hub.requests == []


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_unreachable_hub_is_a_clear_error_and_leaves_output_untouched(trained, hub, monkeypatch):
    run_dir, _ = trained
    before = digest_tree(run_dir)
    monkeypatch.setenv("HF_ENDPOINT", _closed_port_url())
    with pytest.raises(
        HubPublishError, match=r"failed: ConnectError.*local output dir is\s+unchanged"
    ) as info:
        publish(run_dir, REPO)
    assert TOKEN not in str(info.value)
    assert digest_tree(run_dir) == before


def test_failed_commit_stores_nothing(trained, hub):
    run_dir, _ = trained
    before = digest_tree(run_dir)
    hub.fail_commits = True
    with pytest.raises(HubPublishError, match="500"):
        publish(run_dir, REPO)
    assert hub.commits == [] and not hub.repo_dir(REPO).exists()
    assert digest_tree(run_dir) == before


def test_trainer_push_to_hub_publishes_the_same_card(hub, tiny_tokenizer, tmp_path, monkeypatch):
    from conftest import make_tiny_model
    from peft import LoraConfig

    from grpo_plugin import GRPOConfig, GRPOTrainer

    monkeypatch.delenv("HF_TOKEN")  # the token only travels through GRPOConfig.hub_token
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
        max_completion_length=4, max_steps=1, save_strategy="no", disable_tqdm=True,
        hub_token=TOKEN,
    )  # fmt: skip
    trainer = GRPOTrainer(
        make_tiny_model(tiny_tokenizer),
        lambda prompts, completions, **kw: [float(len(c)) for c in completions],
        args=args,
        train_dataset=[{"prompt": f"{i}+{i}="} for i in range(8)],
        processing_class=tiny_tokenizer,
        peft_config=LoraConfig(r=4, target_modules="all-linear"),
    )
    trainer.train()
    trainer.push_to_hub(REPO, commit_message="from the trainer")
    assert hub.commits[-1]["summary"] == "from the trainer"
    stored = hub.repo_dir(REPO)
    assert {"adapter_model.safetensors", "README.md", "reward_curve.png"} <= {
        p.name for p in stored.iterdir()
    }
    card = ModelCard.load(stored / "README.md")
    assert card.data.library_name == "peft" and "grpo-plugin" in card.data.tags
    assert any(TOKEN in r.headers.get("authorization", "") for r in hub.requests)
    assert_token_absent(tmp_path / "run", stored)


def test_merge_checks_the_base_before_loading_it(
    tmp_path, hub, tiny_model_dir, tiny_tokenizer, capsys
):
    """A base that moved since training: one line and exit 2, nothing loaded or uploaded."""
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    run_dir = tmp_path / "run"
    make_adapter_run(run_dir, base, tiny_tokenizer)
    shutil.rmtree(base)
    assert main(["publish", str(run_dir), "--repo-id", REPO, "--merge"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: model path {base} does not exist") and err.count("\n") == 1
    assert hub.requests == []


# ----------------------------------------------------------------------------- --gguf


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """An adapter run whose tokenizer GGUF export can write (byte-level BPE)."""
    from conftest import make_bpe_tokenizer, make_tiny_model

    tok = make_bpe_tokenizer("llama")
    base_dir = tmp_path_factory.mktemp("bpe-base")
    make_tiny_model(tok).save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    run_dir = tmp_path_factory.mktemp("bpe-run")
    make_adapter_run(run_dir, base_dir, tok)
    return run_dir


def test_publish_gguf_uploads_it_with_a_modelfile_and_a_card_section(bpe_run, hub, tmp_path):
    from transformers import AutoModelForCausalLM

    before = digest_tree(bpe_run)
    publish(bpe_run, REPO, PublishOptions(gguf="q8_0"))
    assert len(hub.commits) == 1
    stored = hub.repo_dir(REPO)
    files = set(digest_tree(stored))
    assert {"tiny-grpo-q8_0.gguf", "tiny-grpo-q8_0.Modelfile", "adapter_model.safetensors"} <= files
    card = (stored / "README.md").read_text()
    assert "## Run it locally" in card
    assert f"llama-cli --hf-repo {REPO} --hf-file tiny-grpo-q8_0.gguf" in card
    assert "ollama create tiny-grpo -f tiny-grpo/tiny-grpo-q8_0.Modelfile" in card
    assert (
        (stored / "tiny-grpo-q8_0.Modelfile").read_text().startswith("FROM ./tiny-grpo-q8_0.gguf")
    )
    (tmp_path / "g").mkdir()
    shutil.copy(stored / "tiny-grpo-q8_0.gguf", tmp_path / "g")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "g", gguf_file="tiny-grpo-q8_0.gguf")
    assert model.config.model_type == "llama"
    assert digest_tree(bpe_run) == before  # the run dir is untouched


def test_publish_gguf_bad_type_or_tokenizer_commits_nothing(bpe_run, trained, hub):
    with pytest.raises(ValueError, match="--gguf 'q3_k' is not a type"):
        publish(bpe_run, REPO, PublishOptions(gguf="q3_k"))
    assert (
        main(["publish", str(bpe_run), "--repo-id", REPO, "--gguf", "q3_k"]) == 2
    )  # bad input: exit 2, before any upload
    with pytest.raises(ValueError, match="not byte-level BPE"):
        publish(trained[0], REPO, PublishOptions(gguf="f16"))  # the char-level test tokenizer
    assert hub.commits == []
