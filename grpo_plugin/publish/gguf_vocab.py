"""The tokenizer half of a GGUF export, and the Ollama `Modelfile` beside it.

A GGUF has no `tokenizer.json`: llama.cpp reads the vocabulary, the merges, the token types, the
special ids and the name of the pre-tokenizer (`tokenizer.ggml.pre`) from metadata, and applies its
own copy of that pre-tokenizer. So only byte-level BPE tokenizers whose pre-tokenizer llama.cpp
knows by name are exported (SmolLM2's, Qwen2's, Llama 3's, GPT-2's); anything else is refused with
one line rather than written as a file that tokenizes differently (silent wrongness).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Llama 3's split (its tokenizer.json spells exactly this regex); llama.cpp calls it "llama-bpe".
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SUPPORTED_PRE = "SmolLM2 (smollm), Qwen2 (qwen2), Llama 3 (llama-bpe), GPT-2 (gpt-2)"
# Token types as llama.cpp numbers them (gguf.TokenType).
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>")


class GGUFExportError(ValueError):
    """Bad input for a GGUF export (one line); nothing was written."""


class GGUFTokenizerError(GGUFExportError):
    """The tokenizer cannot be written so that llama.cpp tokenizes exactly as transformers does."""


@dataclass
class VocabFacts:
    """Everything `tokenizer.*` in the GGUF holds."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    special_ids: dict[str, int] = field(default_factory=dict)  # bos, eos, pad, unk, eot
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None


def _qwen2_split() -> str:
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    return PRETOKENIZE_REGEX


def pre_tokenizer_name(pre: dict[str, Any] | None) -> str:
    """llama.cpp's name for this `tokenizer.json` pre-tokenizer; GGUFTokenizerError if unknown."""
    steps = (pre or {}).get("pretokenizers") if (pre or {}).get("type") == "Sequence" else [pre]
    steps = [s for s in steps or [] if s]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        if steps[1].get("use_regex", True):
            return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        names = {_qwen2_split(): "qwen2", LLAMA3_SPLIT: "llama-bpe"}
        if regex in names and steps[0].get("behavior") == "Isolated":
            return names[regex]
    raise GGUFTokenizerError(
        f"The tokenizer's pre-tokenizer ({' + '.join(map(str, kinds)) or 'none'}) is not one "
        f"llama.cpp knows by name, so the GGUF would tokenize differently; supported: "
        f"{SUPPORTED_PRE}."
    )


def _backend(tokenizer: Any) -> dict[str, Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise GGUFTokenizerError(
            f"{type(tokenizer).__name__} is a slow tokenizer; GGUF export needs a fast "
            "(tokenizer.json) byte-level BPE tokenizer."
        )
    spec = json.loads(backend.to_str())
    if spec["model"].get("type") != "BPE":
        raise GGUFTokenizerError(
            f"The tokenizer is {spec['model'].get('type')}, not byte-level BPE; GGUF export "
            f"supports byte-level BPE tokenizers: {SUPPORTED_PRE}."
        )
    return spec


def _add_flags(tokenizer: Any) -> tuple[bool, bool]:
    """Whether encoding adds BOS / EOS (read off an encoding, whatever the post-processor is)."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    extra = len(full) > len(bare)
    return (
        extra and bos is not None and full[0] == bos,
        extra and eos is not None and full[-1] == eos,
    )


def vocab_facts(tokenizer: Any, vocab_size: int) -> VocabFacts:
    """The GGUF's tokenizer metadata for `tokenizer`, padded to the model's `vocab_size` rows."""
    spec = _backend(tokenizer)
    pre = pre_tokenizer_name(spec.get("pre_tokenizer"))
    vocab = tokenizer.get_vocab()
    if len(vocab) > vocab_size or max(vocab.values()) >= vocab_size:
        raise GGUFTokenizerError(
            f"The tokenizer has {len(vocab)} tokens but the model's embedding has {vocab_size} "
            "rows; export the tokenizer the model was trained with."
        )
    by_id = {i: t for t, i in vocab.items()}
    added = {i: tok for i, tok in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if (
            i not in by_id
        ):  # embedding rows beyond the tokenizer (Qwen2.5 pads to a multiple of 128)
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        tokens.append(by_id[i])
        types.append(NORMAL if i not in added else CONTROL if added[i].special else USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    ids = {
        name: getattr(tokenizer, f"{name}_token_id")
        for name in ("bos", "eos", "pad", "unk")
        if getattr(tokenizer, f"{name}_token_id", None) is not None
    }
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    eot = [t for t in END_OF_TURN if t in vocab and t in (template or "")]
    if eot:
        ids["eot"] = vocab[eot[0]]
    add_bos, add_eos = _add_flags(tokenizer)
    return VocabFacts(tokens, types, merges, pre, ids, add_bos, add_eos, template)


# ----------------------------------------------------------------------------- Modelfile

_CHATML = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)
_LLAMA3 = (
    "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n"
    "{{ .Content }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
)


def modelfile_text(gguf_name: str, facts: VocabFacts) -> str:
    """An Ollama Modelfile: FROM the GGUF beside it, the chat format as a Go template (ChatML and
    Llama 3 are recognised; any other template is kept as a comment, and Ollama then falls back on
    the `tokenizer.chat_template` inside the GGUF), and a stop for each end-of-turn token."""
    template = facts.chat_template or ""
    lines = [f"FROM ./{gguf_name}", ""]
    if "<|im_start|>" in template:
        lines += [f'TEMPLATE """{_CHATML}"""']
    elif "<|start_header_id|>" in template:
        lines += [f'TEMPLATE """{_LLAMA3}"""']
    elif template:
        lines += ["# The chat template has no Ollama mapping here; the jinja one, for reference:"]
        lines += [f"# {line}" for line in template.splitlines()]
    stops = [facts.tokens[facts.special_ids["eos"]]] if "eos" in facts.special_ids else []
    stops += [t for t in END_OF_TURN if t in template and t not in stops]
    lines += [""] + [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    return "\n".join(lines) + "\n"
