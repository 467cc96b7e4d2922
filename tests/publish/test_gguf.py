"""GGUF export: what transformers' own GGUF loader reads back from the file we write.

Tiny random Llama and Qwen2 models with a tiny byte-level BPE tokenizer (trained here, offline, on
a few strings, with Llama 3's and Qwen2's pre-tokenizers: the ones llama.cpp knows by name). The
GGUF is loaded from a directory that holds nothing else: given tokenizer files beside it,
transformers mixes them into the GGUF's tokenizer.
"""

from __future__ import annotations

import errno
import random
import shutil

import gguf
import pytest
import torch
import transformers
from conftest import CHATML_SPECIALS as SPECIALS
from conftest import (
    held_lock,
    make_bpe_tokenizer,
    make_tiny_tokenizer,
    make_trainer,
    tiny_lora,
)
from packaging.version import Version
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_plugin.publish import gguf as gguf_export
from grpo_plugin.publish.gguf import GGUFExportError, export_gguf, write_gguf
from grpo_plugin.publish.gguf_vocab import modelfile_text, pre_tokenizer_name, vocab_facts
from grpo_plugin.publish.weights import merged_model

# Bounds on max |logit difference|, with logits spanning about +-3 (INIT_RANGE 0.1). Measured
# (llama / qwen2): f16 0.0027 / 0.0028, bf16 0.022 / 0.022, q8_0 0.075 / 0.069.
F16_ATOL = 1e-2  # the bound
BF16_ATOL = 0.05
Q8_ATOL = 0.15
INIT_RANGE = 0.1


def make_model(arch: str, vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=arch == "qwen2",  # both cases: llama writes output.weight, qwen2 not
        initializer_range=INIT_RANGE,
    )
    model = model_class(config).eval()
    if arch == "qwen2":  # Qwen2 has q/k/v biases; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.data.normal_(0, INIT_RANGE)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch_setup(request):
    arch = request.param
    tok = make_bpe_tokenizer(arch)
    # qwen2: embedding rows beyond the tokenizer, as Qwen2.5 has (the GGUF pads the vocabulary)
    vocab_size = len(tok) + (5 if arch == "qwen2" else 0)
    return arch, tok, make_model(arch, vocab_size)


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def sample_ids(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))


def load_back(path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


@pytest.mark.parametrize("quant, atol", [("f16", F16_ATOL), ("bf16", BF16_ATOL), ("q8_0", Q8_ATOL)])
def test_exported_logits_match(arch_setup, tmp_path, quant, atol):
    arch, tok, model = arch_setup
    paths = write_gguf(model, tok, tmp_path / f"m-{quant}.gguf", quant)
    back = load_back(paths.gguf)
    assert back.config.model_type == arch
    assert back.config.tie_word_embeddings == model.config.tie_word_embeddings
    ids = sample_ids(model.config.vocab_size)
    expected, got = logits_of(model, ids), logits_of(back, ids)
    assert expected.abs().max() > 2  # a meaningful scale for the bound
    err = (got - expected).abs().max().item()
    assert err <= atol, f"{arch} {quant}: max |logit diff| {err:.4f} > {atol}"
    assert err > 0  # really went through a lossy format


def test_q8_0_is_smaller_and_lossier_than_f16(arch_setup, tmp_path):
    arch, tok, model = arch_setup
    ids = sample_ids(model.config.vocab_size)
    sizes, errors = {}, {}
    for quant in ("f16", "q8_0"):
        paths = write_gguf(model, tok, tmp_path / f"m-{quant}.gguf", quant)
        sizes[quant] = paths.gguf.stat().st_size
        errors[quant] = (logits_of(load_back(paths.gguf), ids) - logits_of(model, ids)).abs().max()
    assert sizes["q8_0"] < 0.7 * sizes["f16"]
    assert errors["f16"] < errors["q8_0"]


def test_strings(tok) -> list[str]:
    rng = random.Random(0)
    words = ["hello", "world", "What", "is", "the", "answer", "Let's", "think", "there", "x"]
    out = [f"What is {rng.randint(0, 999)} + {rng.randint(0, 999)}?" for _ in range(100)]
    for _ in range(100):
        seps = [" ", "  ", "\n", "\n\n", "\t", ", ", " - "]
        out.append("".join(rng.choice(words) + rng.choice(seps) for _ in range(rng.randint(1, 8))))
    out += ["", " ", "   leading", "trailing   ", "Ünïcödé café 東京 🙂", "a'b 've 'S 123456789"]
    out += [f"{s}text{s}" for s in SPECIALS] + ["<|im_start|>user\nhi<|im_end|>\n"]
    for i in range(60):
        messages = [{"role": "user", "content": rng.choice(out[:200])}]
        if i % 2:
            messages += [{"role": "assistant", "content": f"{i} is the answer."}]
        out.append(
            tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=i % 3 == 0)
        )
    return out


test_strings.__test__ = False  # a helper, not a test


def test_tokenizer_reads_back_with_the_same_ids(arch_setup, tmp_path):
    arch, tok, model = arch_setup
    paths = write_gguf(model, tok, tmp_path / "m.gguf", "f16")
    back = AutoTokenizer.from_pretrained(tmp_path, gguf_file=paths.gguf.name)
    expected = ("<|endoftext|>", "<|im_end|>", "<|endoftext|>")
    fields = gguf.GGUFReader(paths.gguf).fields  # what llama.cpp and Ollama read
    keys = (gguf.Keys.Tokenizer.BOS_ID, gguf.Keys.Tokenizer.EOS_ID, gguf.Keys.Tokenizer.PAD_ID)
    assert tuple(tok.convert_ids_to_tokens(fields[key].contents()) for key in keys) == expected
    if Version(transformers.__version__) >= Version("5.18"):
        # before 5.18 transformers' GGUF reader takes the eos from the bos id (llama) or drops the
        # bos (qwen2); docs/dependencies.md. The embedded model sets its own (models/embedded.py).
        assert (back.bos_token, back.eos_token, back.pad_token) == expected
    assert back.chat_template == tok.chat_template
    pre = gguf.GGUFReader(paths.gguf).fields["tokenizer.ggml.pre"].contents()
    assert pre == {"llama": "llama-bpe", "qwen2": "qwen2"}[arch]
    strings = test_strings(tok)
    assert len(strings) >= 250
    for text in strings:
        assert back(text)["input_ids"] == tok(text)["input_ids"], repr(text)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    rendered = back.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# The pre_tokenizer of each family's tokenizer.json, as their Hub repos spell it.
_BYTES = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
REAL_PRE_TOKENIZERS = {
    "smollm": [{"type": "Digits", "individual_digits": True}, dict(_BYTES, use_regex=True)],
    "qwen2": [{"type": "Split", "pattern": {"Regex": _SPLIT % ""}, "behavior": "Isolated"}, _BYTES],
    "llama-bpe": [
        {"type": "Split", "pattern": {"Regex": _SPLIT % "{1,3}"}, "behavior": "Isolated"},
        _BYTES,
    ],
}


@pytest.mark.parametrize("name", sorted(REAL_PRE_TOKENIZERS))
def test_pre_tokenizer_names_of_the_supported_families(name):
    spec = {"type": "Sequence", "pretokenizers": REAL_PRE_TOKENIZERS[name]}
    assert pre_tokenizer_name(spec) == name
    assert pre_tokenizer_name(dict(_BYTES, use_regex=True)) == "gpt-2"


def test_modelfile_beside_the_gguf(arch_setup, tmp_path):
    arch, tok, model = arch_setup
    paths = write_gguf(model, tok, tmp_path / "m-q8_0.gguf", "q8_0")
    text = paths.modelfile.read_text()
    assert paths.modelfile == tmp_path / "m-q8_0.Modelfile"
    assert text.startswith("FROM ./m-q8_0.gguf\n")
    assert "<|im_start|>{{ .Role }}" in text and 'PARAMETER stop "<|im_end|>"' in text


def test_modelfile_for_llama3_and_unknown_templates():
    facts = vocab_facts(make_bpe_tokenizer("llama"), 400)
    facts.chat_template = "<|start_header_id|>{{ m }}<|end_header_id|>{{ c }}<|eot_id|>"
    assert "<|start_header_id|>{{ .Role }}<|end_header_id|>" in modelfile_text("m.gguf", facts)
    facts.chat_template = "{{ 'USER: ' + m }}\n{{ 'BOT:' }}"
    text = modelfile_text("m.gguf", facts)
    assert "TEMPLATE" not in text and "# {{ 'USER: ' + m }}" in text


def test_llama3_rope_scaling_is_written_as_freq_factors():
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    config = LlamaConfig(hidden_size=512, num_attention_heads=4, rope_parameters=rope)
    factors = gguf_export.rope_freq_factors(config)
    assert factors.shape == (64,)
    assert factors[0] == pytest.approx(1.0)  # high frequencies are not scaled
    assert factors[-1] == pytest.approx(8.0)  # low frequencies by `factor`


def test_llama3_rope_factors_land_in_the_file(tmp_path):
    tok = make_bpe_tokenizer("llama")
    model = make_model("llama", len(tok))
    model.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    paths = write_gguf(model, tok, tmp_path / "m.gguf", "q8_0")
    tensors = {t.name: t for t in gguf.GGUFReader(paths.gguf).tensors}
    assert tensors["rope_freqs.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert list(tensors["rope_freqs.weight"].data) == pytest.approx(
        list(gguf_export.rope_freq_factors(model.config))
    )
    model.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(GGUFExportError, match="rope_type default or llama3.*'yarn'"):
        write_gguf(model, tok, tmp_path / "y.gguf", "f16")


# ----------------------------------------------------------------------------- a LoRA run dir


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A 1-step LoRA run on a tiny Llama saved to disk (so grpo_run.json names a loadable base)."""
    tmp = tmp_path_factory.mktemp("lora-run")
    tok = make_bpe_tokenizer("llama")
    make_model("llama", len(tok)).save_pretrained(tmp / "base")
    tok.save_pretrained(tmp / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp / "base")
    trainer = make_trainer(tok, tmp, model=base, peft=tiny_lora(), max_steps=1, learning_rate=0.1)
    trainer.train()
    trainer.save_model()
    return trainer, tmp / "out", tmp / "base"


def test_lora_run_dir_exports_with_the_adapter_merged(lora_run, tmp_path):
    _, run_dir, base_dir = lora_run
    out = tmp_path / "gguf" / "run-f16.gguf"
    out.parent.mkdir()
    paths = export_gguf(run_dir, out, "f16")
    merged_lm = merged_model(run_dir).eval()
    ids = sample_ids(merged_lm.config.vocab_size)
    merged = logits_of(merged_lm, ids)
    base = logits_of(AutoModelForCausalLM.from_pretrained(base_dir).eval(), ids)
    got = logits_of(load_back(paths.gguf), ids)
    assert (merged - base).abs().max() > 5 * F16_ATOL  # the adapter changed the model
    assert (got - merged).abs().max() <= F16_ATOL


def test_trainer_save_gguf(lora_run, tmp_path):
    trainer, run_dir, _ = lora_run
    paths = trainer.save_gguf(tmp_path / "t.gguf", quant="q8_0")
    assert paths.gguf.is_file() and paths.modelfile.is_file()
    assert load_back(paths.gguf).config.model_type == "llama"


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_refused_in_one_line_before_loading(lora_run, tmp_path, monkeypatch):
    _, run_dir, _ = lora_run
    monkeypatch.setattr("grpo_plugin.models.policy.load_model", None)  # nothing may load
    cases = {
        "q3_k": (run_dir, tmp_path / "a.gguf", "q3_k"),  # not a type we write
        "no adapter": (tmp_path, tmp_path / "b.gguf", "f16"),  # not a run dir
        "must end in .gguf": (run_dir, tmp_path / "c.bin", "f16"),
        "does not exist": (run_dir, tmp_path / "nowhere" / "d.gguf", "f16"),
    }
    for needle, (source, out, quant) in cases.items():
        with pytest.raises(ValueError) as err:
            export_gguf(source, out, quant)
        assert needle in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.glob("*.gguf"))


def test_a_run_still_training_is_refused_and_its_checkpoint_named(lora_run, tmp_path, monkeypatch):
    """Issue 56: export on a live run wrote a GGUF of an older step into the live folder."""
    _, run_dir, _ = lora_run
    monkeypatch.setattr("grpo_plugin.models.policy.load_model", None)  # nothing may load
    checkpoint = run_dir / "checkpoint-7"
    checkpoint.mkdir()
    for name in ("trainer_state.json", "adapter_config.json", "adapter_model.safetensors"):
        source = run_dir / name
        (checkpoint / name).write_bytes(source.read_bytes() if source.is_file() else b"{}")
    try:
        with held_lock(run_dir) as pid:
            for source in (run_dir, checkpoint):  # default --out: inside the live folder
                with pytest.raises(GGUFExportError) as err:
                    export_gguf(source, None, "q8_0")
                line = str(err.value)
                assert line.startswith(f"run dir {run_dir} is still training (pid {pid} on here")
                assert f"grpo-plugin export {checkpoint} --gguf q8_0 --out FILE.gguf" in line
            with pytest.raises(GGUFExportError, match="still training"):
                export_gguf(run_dir, tmp_path / "elsewhere.gguf", "q8_0")  # its weights: old
            gguf_export.check_not_training(checkpoint, tmp_path / "c.gguf", "q8_0")  # allowed
    finally:
        shutil.rmtree(checkpoint)
    assert not list(run_dir.rglob("*.gguf")) and not list(tmp_path.glob("*.gguf"))


def test_unsupported_architecture_names_the_supported(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    tok = make_bpe_tokenizer("llama")
    model = MistralForCausalLM(MistralConfig(vocab_size=len(tok), hidden_size=32,
                               intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2))  # fmt: skip
    model.save_pretrained(tmp_path / "run")
    tok.save_pretrained(tmp_path / "run")
    with pytest.raises(GGUFExportError, match=r"llama .* qwen2 .*'mistral'"):
        export_gguf(tmp_path / "run", tmp_path / "m.gguf", "f16")


def test_unsupported_tokenizer_is_refused(tmp_path):
    tok = make_tiny_tokenizer()  # char-level WordLevel: llama.cpp has no such tokenizer
    with pytest.raises(GGUFExportError, match="not byte-level BPE"):
        write_gguf(make_model("llama", len(tok)), tok, tmp_path / "m.gguf", "f16")
    tok = make_bpe_tokenizer("llama")
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(GGUFExportError, match="pre-tokenizer .*Whitespace"):
        write_gguf(make_model("llama", len(tok)), tok, tmp_path / "m.gguf", "f16")
    assert not list(tmp_path.iterdir())


def test_existing_output_needs_overwrite(tmp_path):
    tok = make_bpe_tokenizer("llama")
    model = make_model("llama", len(tok))
    out = tmp_path / "m.gguf"
    out.write_bytes(b"precious")
    with pytest.raises(GGUFExportError, match="already exist.*--overwrite"):
        write_gguf(model, tok, out, "f16")
    assert out.read_bytes() == b"precious"
    write_gguf(model, tok, out, "f16", overwrite=True)
    assert out.read_bytes()[:4] == b"GGUF"


def test_full_disk_leaves_nothing_under_the_final_name(tmp_path, monkeypatch):
    tok = make_bpe_tokenizer("qwen2")
    model = make_model("qwen2", len(tok))
    old = tmp_path / "old.gguf"
    write_gguf(model, tok, old, "f16")
    kept = old.read_bytes()

    def disk_full(self, *args, **kwargs):
        self.fout[0].write(b"\0" * 1000)  # half a file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full)
    with pytest.raises(GGUFExportError, match="No space left.*nothing was left") as err:
        write_gguf(model, tok, tmp_path / "new.gguf", "q8_0")
    assert "\n" not in str(err.value)
    with pytest.raises(GGUFExportError):
        write_gguf(model, tok, old, "q8_0", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.Modelfile", "old.gguf"]
    assert old.read_bytes() == kept
