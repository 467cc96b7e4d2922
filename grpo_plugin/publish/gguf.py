"""Export a run as one GGUF file (llama.cpp, Ollama, LM Studio) and an Ollama Modelfile beside it.

    grpo-plugin export RUN_DIR --gguf q8_0 [--out FILE] [--overwrite]
    trainer.save_gguf("model-q8_0.gguf", quant="q8_0")

A LoRA adapter is merged into the base first, reloaded in float32 (`weights.merged_model`, the one
merge path, also for an adapter trained on a 4-bit base). Written with the `gguf` package only:
2-D weights in the chosen type (a row length that is no multiple of the block size falls back to
f16, as llama.cpp's converter does), 1-D tensors (norms, biases) in f32. Llama's q/k rows are
permuted into llama.cpp's rotary layout (transformers' GGUF loader undoes it); Qwen2's are not.

Every check runs before a model loads; the file is written under a temporary name in the same
directory and renamed at the end, so a failure (a full disk) leaves nothing under the final name.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..run import checkpoints, rundir
from ..run import lock as run_lock
from .gguf_vocab import GGUFExportError, VocabFacts, modelfile_text, vocab_facts

logger = logging.getLogger(__name__)

# --gguf TYPE: the types the gguf package quantizes itself (in numpy) and transformers reads back.
QUANT_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
# transformers' model_type -> llama.cpp's architecture name.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}
SUPPORTED_MODELS = "llama (SmolLM2, Llama 3.x) and qwen2 (Qwen2, Qwen2.5)"
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class ExportPaths:
    gguf: Path
    modelfile: Path


# ----------------------------------------------------------------------------- checks


def check_quant(quant: str) -> Any:
    """The `gguf.GGMLQuantizationType` for `quant`; GGUFExportError naming the choices."""
    from gguf import GGMLQuantizationType

    if str(quant).lower() not in QUANT_TYPES:
        raise GGUFExportError(
            f"--gguf {quant!r} is not a type this export writes; use one of {', '.join(QUANT_TYPES)}."
        )
    return GGMLQuantizationType[str(quant).upper()]


def check_architecture(config: Any) -> str:
    """llama.cpp's name for the model's architecture; GGUFExportError naming the supported ones."""
    model_type = getattr(config, "model_type", None)
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        raise GGUFExportError(
            f"GGUF export supports the architectures {SUPPORTED_MODELS}; this model is "
            f"{model_type!r}."
        )
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in ROPE_TYPES or (rope == "llama3" and arch != "llama"):
        raise GGUFExportError(
            f"GGUF export supports rope_type {' or '.join(ROPE_TYPES)} (llama3 on Llama only); "
            f"this model's config has {rope!r}."
        )
    return arch


def output_paths(out: str | Path, overwrite: bool) -> ExportPaths:
    """The GGUF and its Modelfile (`NAME.Modelfile`); refuse to replace either without overwrite."""
    gguf_path = Path(out)
    if gguf_path.suffix != ".gguf":
        raise GGUFExportError(f"--out {gguf_path} must end in .gguf.")
    if not gguf_path.parent.is_dir():
        raise GGUFExportError(
            f"--out {gguf_path}: the directory {gguf_path.parent} does not exist."
        )
    paths = ExportPaths(gguf_path, gguf_path.with_suffix(".Modelfile"))
    existing = [str(p) for p in (paths.gguf, paths.modelfile) if p.exists()]
    if existing and not overwrite:
        raise GGUFExportError(
            f"{' and '.join(existing)} already exist(s); pass --overwrite to replace, or --out."
        )
    return paths


# ----------------------------------------------------------------------------- tensors


def _permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotary layout (halves) -> llama.cpp's (interleaved pairs), per head."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def rope_freq_factors(config: Any) -> np.ndarray:
    """Llama 3's rope scaling as llama.cpp stores it: `rope_freqs.weight`, the factor each default
    inverse frequency is divided by (transformers' own llama3 rule, so the two cannot drift)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = config.rope_parameters["rope_theta"]
    default = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    return (default / scaled.float().numpy()).astype(np.float32)


def _tensor_type(data: np.ndarray, qtype: Any) -> Any:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if data.ndim == 1:
        return GGMLQuantizationType.F32
    block = GGML_QUANT_SIZES[qtype][0]
    return qtype if data.shape[-1] % block == 0 else GGMLQuantizationType.F16


def gguf_tensors(model: Any, arch: str, qtype: Any):
    """Yield `(gguf_name, data, raw_type)` for every weight of `model`, converted."""
    import gguf

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and tied:
            continue  # llama.cpp reuses token_embd when output.weight is absent
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is None or suffix not in ("weight", "bias"):
            raise GGUFExportError(
                f"No GGUF name for the tensor {hf_name}; this model cannot be exported."
            )
        data = tensor.detach().float().cpu().numpy()
        if arch == "llama" and gguf_name.endswith((".attn_q", ".attn_k")):
            heads = (
                config.num_attention_heads
                if gguf_name.endswith("q")
                else config.num_key_value_heads
            )
            data = _permute_qk(data, heads)
        kind = _tensor_type(data, qtype)
        yield f"{gguf_name}.{suffix}", gguf.quants.quantize(data, kind), kind
    if (getattr(config, "rope_parameters", None) or {}).get("rope_type") == "llama3":
        yield "rope_freqs.weight", rope_freq_factors(config), gguf.GGMLQuantizationType.F32


# ----------------------------------------------------------------------------- metadata


def _add_model_metadata(writer: Any, config: Any, name: str, qtype: Any) -> None:
    import gguf

    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.num_key_value_heads or heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    if head_dim != config.hidden_size // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    file_type = {"F32": "ALL_F32"}.get(qtype.name, f"MOSTLY_{qtype.name}")
    writer.add_file_type(gguf.LlamaFileType[file_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_tokenizer_metadata(writer: Any, facts: VocabFacts) -> None:
    writer.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
    writer.add_tokenizer_pre(facts.pre)
    writer.add_token_list(facts.tokens)
    writer.add_token_types(facts.token_types)
    writer.add_token_merges(facts.merges)
    ids = facts.special_ids
    for key, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("pad", writer.add_pad_token_id),
        ("unk", writer.add_unk_token_id),
        ("eot", writer.add_eot_token_id),
    ):
        if key in ids:
            add(ids[key])
    writer.add_add_bos_token(facts.add_bos)
    writer.add_add_eos_token(facts.add_eos)
    if facts.chat_template:
        writer.add_chat_template(facts.chat_template)


# ----------------------------------------------------------------------------- writing


def _write_atomic(path: Path, write) -> None:
    """`write(temp_path)`, then rename onto `path`; on any failure remove the temp file."""
    temp = rundir.temporary_path(path)  # a run folder's own pattern: a kill's leftover is known
    try:
        write(temp)
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as err:
        raise GGUFExportError(
            f"Writing {path} failed ({type(err).__name__}: {err}); nothing was left under that "
            "name. Free space (or fix the directory) and rerun."
        ) from err
    finally:
        temp.unlink(missing_ok=True)


def write_gguf(
    model: Any, tokenizer: Any, out: str | Path, quant: str = "f16", *, overwrite: bool = False
) -> ExportPaths:
    """Write a merged (plain, not PEFT) `model` and its tokenizer as a GGUF + Modelfile."""
    import gguf

    qtype = check_quant(quant)
    arch = check_architecture(model.config)
    paths = output_paths(out, overwrite)
    facts = vocab_facts(tokenizer, model.config.vocab_size)
    name = Path(str(model.config.name_or_path or paths.gguf.stem)).name

    def write(temp: Path) -> None:
        writer = gguf.GGUFWriter(temp, arch)
        try:
            _add_model_metadata(writer, model.config, name, qtype)
            _add_tokenizer_metadata(writer, facts)
            for tensor_name, data, kind in gguf_tensors(model, arch, qtype):
                raw = None if kind.name in ("F32", "F16") else kind
                writer.add_tensor(tensor_name, data, raw_dtype=raw)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()

    _write_atomic(paths.gguf, write)
    _write_atomic(paths.modelfile, lambda t: t.write_text(modelfile_text(paths.gguf.name, facts)))
    size = paths.gguf.stat().st_size / 2**20
    logger.info("Wrote %s (%s, %.1f MiB) and %s", paths.gguf, quant, size, paths.modelfile.name)
    return paths


# ----------------------------------------------------------------------------- a run dir


def check_not_training(run_dir: Path, out: Path, quant: str) -> None:
    """Refuse (one line) to export a run still training (its top-level weights are an older
    save, or none), and to write into its folder; a checkpoint of it may be exported elsewhere."""
    live = run_lock.live_run(run_dir)
    if live is None:
        return
    root, holder = live
    inside = root.resolve() in out.resolve().parents
    if root == run_dir or inside:  # the run folder itself, or the file would land in it
        newest = checkpoints.latest_complete(root)
        other = (
            f", or export its newest checkpoint to a file outside the run folder: grpo-plugin "
            f"export {newest} --gguf {quant} --out FILE.gguf"
            if newest is not None
            else ""
        )
        raise GGUFExportError(
            f"run dir {root} is still training ({holder}); nothing was written: wait for it to "
            f"finish{other}"
        )


def _source_config(run_dir: Path, kind: str) -> Any:
    from transformers import AutoConfig

    from ..models.embedded import resolve_model_path
    from .weights import base_model_ref

    source = run_dir if kind == "full" else base_model_ref(run_dir)
    return AutoConfig.from_pretrained(resolve_model_path(str(source)))


def export_gguf(
    run_dir: str | Path,
    out: str | Path | None = None,
    quant: str = "f16",
    *,
    overwrite: bool = False,
) -> ExportPaths:
    """`grpo-plugin export RUN_DIR --gguf TYPE`: merge (if an adapter), then `write_gguf`.

    The default `out` is `RUN_DIR/<run dir name>-<TYPE>.gguf`. Everything that can be checked
    (type, output path, run dir, architecture, tokenizer) is checked before the weights load.
    """
    import torch
    from transformers import AutoTokenizer

    from ..models.policy import load_model
    from .weights import merged_model, model_kind

    run_dir = Path(run_dir)
    check_quant(quant)
    out = Path(out) if out else run_dir / f"{run_dir.resolve().name}-{quant.lower()}.gguf"
    check_not_training(run_dir, out, quant)
    output_paths(out, overwrite)
    kind = model_kind(run_dir)  # one line if the dir holds neither an adapter nor weights
    config = _source_config(run_dir, kind)
    check_architecture(config)
    tokenizer = AutoTokenizer.from_pretrained(str(run_dir))
    vocab_facts(tokenizer, config.vocab_size)
    model = (
        merged_model(run_dir)
        if kind == "adapter"
        else load_model(str(run_dir), {"dtype": torch.float32})
    )
    return write_gguf(model.eval(), tokenizer, out, quant, overwrite=overwrite)


def save_trainer_gguf(
    trainer: Any, path: str | Path, quant: str = "f16", overwrite: bool = False
) -> ExportPaths:
    """`GRPOTrainer.save_gguf`: save the run, then export it (a LoRA adapter merged into a float32
    reload of its base, so a 4-bit base is handled as `publish --merge` handles it)."""
    trainer.save_model(trainer.args.output_dir)
    return export_gguf(trainer.args.output_dir, path, quant, overwrite=overwrite)
