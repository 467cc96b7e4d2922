"""The model card (`README.md`) of a training run's output dir.

Reads the run directory (`run/rundir.py`): `grpo_run.json` (what was trained, how), `eval.json`
(held-out accuracy before/after and during training, optional; see `card_eval.py`) and the curve
drawn by `plot.py`. The card's
YAML metadata is built with `huggingface_hub.ModelCardData` (never by hand); the body states the
objective with its paper link, the key hyperparameters, the rewards, the eval table, the curve,
a `peft` load-and-generate snippet, and citations.

`base_model` goes into the metadata only when it looks like a Hub id (a local path is not one the
Hub can link to); it is always named in the body.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..core.objectives import PAPERS, objective_name
from ..run.rundir import CARD_FILE, CURVE_FILE, load_run_info
from .card_eval import eval_section, md_code, md_text

BASE_TAGS = ["grpo", "grpo-plugin", "reinforcement-learning"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

CITATIONS = {
    "GRPO": """@article{shao2024deepseekmath,
  title   = {DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models},
  author  = {Shao, Zhihong and Wang, Peiyi and Zhu, Qihao and Xu, Runxin and Song, Junxiao and Bi, Xiao and Zhang, Haowei and Zhang, Mingchuan and Li, Y. K. and Wu, Y. and Guo, Daya},
  journal = {arXiv preprint arXiv:2402.03300},
  year    = {2024}
}""",
    "DAPO": """@article{yu2025dapo,
  title   = {DAPO: An Open-Source LLM Reinforcement Learning System at Scale},
  author  = {Yu, Qiying and others},
  journal = {arXiv preprint arXiv:2503.14476},
  year    = {2025}
}""",
    "Dr. GRPO": """@article{liu2025understanding,
  title   = {Understanding R1-Zero-Like Training: A Critical Perspective},
  author  = {Liu, Zichen and Chen, Changyu and Li, Wenjun and Qi, Penghui and Pang, Tianyu and Du, Chao and Lee, Wee Sun and Lin, Min},
  journal = {arXiv preprint arXiv:2503.20783},
  year    = {2025}
}""",
    "GSPO": """@article{zheng2025gspo,
  title   = {Group Sequence Policy Optimization},
  author  = {Zheng, Chujie and others},
  journal = {arXiv preprint arXiv:2507.18071},
  year    = {2025}
}""",
    "RLOO": """@inproceedings{ahmadian2024back,
  title     = {Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs},
  author    = {Ahmadian, Arash and Cremer, Chris and Gall{\\'e}, Matthias and Fadaee, Marzieh and Kreutzer, Julia and Pietquin, Olivier and {\\"U}st{\\"u}n, Ahmet and Hooker, Sara},
  booktitle = {Proceedings of ACL},
  year      = {2024}
}""",
}


# ----------------------------------------------------------------------------- the card


def _objective(run: dict[str, Any]) -> tuple[str, str]:
    """(display name, paper link) of the run's objective."""
    objective = run.get("objective") or {}
    name = objective_name(
        objective.get("loss_type", "grpo"),
        objective.get("importance_sampling_level", "token"),
        objective.get("advantage_estimator", "grpo"),
    )
    return name, PAPERS[name]


def _variant_tag(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # "Dr. GRPO" -> "dr-grpo"


def is_hub_id(name: str | None) -> bool:
    return bool(name) and bool(_HUB_ID.match(name)) and not Path(name).exists()


def build_card_data(run: dict[str, Any], *, merged: bool) -> ModelCardData:
    """The card's YAML metadata."""
    tags = list(BASE_TAGS)
    if run.get("objective"):
        variant = _variant_tag(_objective(run)[0])
        tags += [variant] if variant not in tags else []
    if not merged and run.get("adapter", True):
        tags.append("lora")
    base_model = run.get("base_model")
    return ModelCardData(
        base_model=base_model if is_hub_id(base_model) else None,
        library_name="transformers" if merged or not run.get("adapter", True) else "peft",
        tags=tags,
        datasets=list(run.get("datasets") or []) or None,
        license=run.get("license") or None,
        pipeline_tag="text-generation",
    )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return "–" if value is None else str(value)


def _objective_section(run: dict[str, Any]) -> str:
    objective = run.get("objective")
    if not objective:
        return "## Training\n\nThe run's settings (`grpo_run.json`) were not found.\n"
    name, link = _objective(run)
    lines = [
        "## Training",
        "",
        f"Trained with **[{name}]({link})**{_family(name)} using grpo-plugin, "
        "on rewards that a program verifies.",
        "",
        "| setting | value |",
        "|---|---|",
    ]
    rows = [
        ("objective", f"[{name}]({link})"),
        ("advantage estimator", objective.get("advantage_estimator")),
        ("loss aggregation (`loss_type`)", objective.get("loss_type")),
        ("importance ratio level", objective.get("importance_sampling_level")),
        ("reward scaling", objective.get("scale_rewards")),
        ("group size G", objective.get("num_generations")),
        ("KL coefficient β", objective.get("beta")),
        ("clip ε (low)", objective.get("epsilon")),
        ("clip ε (high)", objective.get("epsilon_high")),
        ("policy updates per batch μ", objective.get("num_iterations")),
        ("dynamic sampling", objective.get("dynamic_sampling")),
        ("learning rate", run.get("learning_rate")),
        ("optimizer steps", run.get("global_step")),
        ("max completion length", run.get("max_completion_length")),
        ("sampling temperature", run.get("temperature")),
    ]
    lines += [f"| {key} | {_fmt(value)} |" for key, value in rows if value is not None]
    lines += ["", _adapter_sentence(run), "", _rewards_sentence(run)]
    return "\n".join(lines) + "\n"


def _family(name: str) -> str:
    """ ", a variant of GRPO (...)" for the variants; "" for GRPO itself."""
    if name == "GRPO":
        return " (Group Relative Policy Optimization)"
    return f", a variant of [GRPO]({PAPERS['GRPO']}) (Group Relative Policy Optimization),"


def _adapter_sentence(run: dict[str, Any]) -> str:
    lora = run.get("lora")
    quant = " on a 4-bit (NF4) quantised base (QLoRA)" if run.get("load_in_4bit") else ""
    if not run.get("adapter", True) or not lora:
        return f"All weights were trained{quant}."
    return (
        f"A LoRA adapter was trained{quant}: r = {lora.get('r')}, alpha = {lora.get('lora_alpha')}, "
        f"target modules: {_fmt(lora.get('target_modules'))}."
    )


def _reward_entry(func: dict[str, Any]) -> str:
    weight = f"weight {_fmt(func.get('weight', 1.0))}"
    if func.get("model"):
        return f"{md_code(func.get('name'))} (reward model {md_code(func['model'])}, {weight})"
    return f"{md_code(func.get('name'))} ({weight})"


def _rewards_sentence(run: dict[str, Any]) -> str:
    funcs = run.get("reward_funcs") or []
    if not funcs:
        return "Reward functions: not recorded."
    listed = ", ".join(_reward_entry(f) for f in funcs)
    datasets = run.get("datasets") or []
    data = f" Training prompts: {', '.join(md_code(d) for d in datasets)}." if datasets else ""
    tools = run.get("tools") or []
    used = f" Tools the model could call: {', '.join(md_code(t) for t in tools)}." if tools else ""
    return f"Reward functions (weighted sum): {listed}.{data}{used}"


def _curve_section(output_dir: Path) -> str:
    if not (output_dir / CURVE_FILE).is_file():
        return ""
    return (
        "## Reward curve\n\n"
        f"![Training reward, held-out accuracy with 95% intervals, completion length and KL "
        f"against step]({CURVE_FILE})\n"
    )


def _base_notes(run: dict[str, Any], merged: bool) -> list[str]:
    notes = []
    base_path = str(run.get("base_model_path") or "")
    if base_path.startswith("embedded:"):
        notes.append(
            f"Training used {md_code(base_path)}, a copy of the base dequantised from a GGUF file, "
            f"so its weights differ slightly from {md_code(run.get('base_model'))} on the Hub."
        )
    if run.get("load_in_4bit") and merged:
        notes.append(
            "The adapter was trained against a 4-bit (NF4) base. For merging, the base was reloaded "
            "in 32-bit floats and the adapter merged into those full-precision weights, so outputs "
            "differ slightly from the 4-bit model used in training."
        )
    elif run.get("load_in_4bit"):
        notes.append(
            "The adapter was trained against a 4-bit (NF4) base; load the base with "
            "`quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4')` "
            "to reproduce training conditions exactly (16/32-bit also works, with small differences)."
        )
    return notes


def _usage_section(run: dict[str, Any], repo_id: str, merged: bool) -> str:
    base = run.get("base_model") or "BASE_MODEL"
    if merged or not run.get("adapter", True):
        load = f'model = AutoModelForCausalLM.from_pretrained("{repo_id}")'
        imports = "from transformers import AutoModelForCausalLM, AutoTokenizer"
    else:
        load = (
            f'base = AutoModelForCausalLM.from_pretrained("{base}")\n'
            f'model = PeftModel.from_pretrained(base, "{repo_id}")'
        )
        imports = "from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer"
    snippet = f"""```python
{imports}

{load}
tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
messages = [{{"role": "user", "content": "What is 17 + 25?"}}]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
)
output = model.generate(**inputs, max_new_tokens={run.get("max_completion_length") or 256}, do_sample=False)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```"""
    notes = "".join(f"\n{note}\n" for note in _base_notes(run, merged))
    return f"## How to use\n\n{snippet}\n{notes}"


def _local_section(repo_id: str, gguf_file: str | None) -> str:
    """ "Run it locally": llama.cpp and Ollama on the GGUF uploaded with `publish --gguf`."""
    if not gguf_file:
        return ""
    modelfile = gguf_file.removesuffix(".gguf") + ".Modelfile"
    name = repo_id.split("/")[-1].lower()
    return f"""## Run it locally

`{gguf_file}` is this model as one GGUF file (adapter merged), for llama.cpp, Ollama and LM Studio.

```bash
# llama.cpp
llama-cli --hf-repo {repo_id} --hf-file {gguf_file} -cnv
# Ollama, with the chat template and stop tokens of `{modelfile}`
hf download {repo_id} {gguf_file} {modelfile} --local-dir {name}
ollama create {name} -f {name}/{modelfile} && ollama run {name}
```
"""


def _citation_section(run: dict[str, Any]) -> str:
    names = ["GRPO"]
    if run.get("objective"):
        name = _objective(run)[0]
        if name != "GRPO":
            names.append(name)
    entries = "\n\n".join(CITATIONS[n] for n in names if n in CITATIONS)
    return f"## Citations\n\n```bibtex\n{entries}\n```\n"


def build_model_card(
    output_dir: str | Path,
    *,
    merged: bool = False,
    repo_id: str | None = None,
    gguf_file: str | None = None,
) -> ModelCard:
    """The model card of a run. `merged`: describe merged full weights instead of an adapter;
    `repo_id`: the id the snippet loads from (else a placeholder); `gguf_file`: a GGUF uploaded
    beside the weights (adds "Run it locally")."""
    output_dir = Path(output_dir)
    run = load_run_info(output_dir)
    card_data = build_card_data(run, merged=merged)
    kind = "merged model" if merged or not run.get("adapter", True) else "LoRA adapter"
    title = md_text(repo_id.split("/")[-1] if repo_id else output_dir.resolve().name)
    base = run.get("base_model") or "an unrecorded base model"
    linked = (
        f"[{md_code(base)}](https://huggingface.co/{base})" if is_hub_id(base) else md_code(base)
    )
    sections = [
        f"# {title}\n\nA {kind} for {linked}, fine-tuned with "
        "reinforcement learning from verifiable rewards by "
        f"grpo-plugin {run.get('grpo_plugin_version', '')}.\n",
        _objective_section(run),
        eval_section(output_dir, run),
        _curve_section(output_dir),
        _usage_section(run, repo_id or "USER/MODEL", merged),
        _local_section(repo_id or "USER/MODEL", gguf_file),
        _citation_section(run),
    ]
    body = "\n".join(section for section in sections if section)
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n{body}")


def write_model_card(output_dir: str | Path, **kwargs: Any) -> Path:
    """Write `README.md` into `output_dir` (keyword arguments go to `build_model_card`)."""
    path = Path(output_dir) / CARD_FILE
    build_model_card(output_dir, **kwargs).save(path)
    return path


def objective_display_name(run: dict[str, Any]) -> str:
    """The objective's display name ("GRPO", "DAPO", "Dr. GRPO", ...); GRPO when not recorded."""
    return _objective(run)[0] if run.get("objective") else "GRPO"
