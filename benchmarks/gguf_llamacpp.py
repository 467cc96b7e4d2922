"""The exported GGUF run by llama.cpp itself (issue 27): held-out greedy accuracy through llama.cpp
next to the HF model's, tokens/s and file sizes, for each GGUF type. Not part of CI: it needs
`llama-cpp-python`, which builds llama.cpp from source (`pip install llama-cpp-python`).

    python benchmarks/gguf_llamacpp.py RUN_DIR [--types f16 q8_0] [--out-dir DIR]
        [--llama-python PATH]

llama.cpp runs in a child process (`--llama-python`: a Python with llama-cpp-python, by default
this one): loaded into the same process as torch, the two OpenMP runtimes crashed it here.

RUN_DIR is a finished recipe run (its `recipe.yaml` names the held-out data and the reward). Both
sides get the same prompt token ids (the run's tokenizer and chat template) and decode greedily
for the recipe's `max_completion_length` tokens or until end of turn, so a difference in accuracy
is the weights' (conversion or quantization), not the prompt's. A gap over 2 points is a bug.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def held_out(run_dir: Path):
    """The run's held-out test rows (never its validation rows), its first reward function and
    its completion budget."""
    from grpo_plugin.app.recipe import load_recipe
    from grpo_plugin.app.recipe_checks import check_recipe
    from grpo_plugin.app.splits import load_splits

    recipe = load_recipe(run_dir / "recipe.yaml")
    reward = check_recipe(recipe)[0]
    return load_splits(recipe.args.dataset).test, reward, recipe.config.max_completion_length


def accuracy(reward, rows, completions: list[str]) -> float:
    columns = {k: rows[k] for k in rows.column_names if k != "prompt"}
    scores = reward(prompts=rows["prompt"], completions=completions, **columns)
    return sum(1.0 for s in scores if s is not None and s >= 1.0) / len(scores)


def hf_greedy(
    run_dir: Path, prompts: list[list[int]], max_new: int, stop: set[int]
) -> list[list[int]]:
    import torch

    from grpo_plugin.publish.weights import merged_model

    model = merged_model(run_dir).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            options = {"max_new_tokens": max_new, "eos_token_id": sorted(stop)}
            generated = model.generate(torch.tensor([ids]), do_sample=False, **options)
            generated = generated[0, len(ids) :].tolist()
            out.append([t for t in generated if t not in stop])
    return out


def llama_greedy(gguf: Path, prompts: list[list[int]], max_new: int, stop: set[int]):
    """Completions through llama.cpp, and decode tokens/s (prefill excluded)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=2, verbose=False)
    out, tokens, seconds = [], 0, 0.0
    for ids in prompts:
        llm.reset()
        generated: list[int] = []
        start = None
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
            if start is None:
                start = time.perf_counter()  # the first token comes after the prefill
            if token in stop or len(generated) == max_new:
                break
            generated.append(token)
        seconds += time.perf_counter() - start
        tokens += max(0, len(generated) - 1)
        out.append(generated)
    return out, tokens / seconds if seconds else float("nan")


def run_llama(python: str, gguf: Path, prompts: list[list[int]], max_new: int, stop: set[int]):
    """`llama_greedy` in a child process (no torch there); returns its completions and speed."""
    job = gguf.with_suffix(".job.json")
    job.write_text(json.dumps({"prompts": prompts, "max_new": max_new, "stop": sorted(stop)}))
    subprocess.run([python, __file__, "--worker", str(gguf), str(job)], check=True)
    done = json.loads(job.read_text())
    return done["completions"], done["tokens_per_s"]


def worker(gguf: Path, job: Path) -> None:
    spec = json.loads(job.read_text())
    completions, speed = llama_greedy(gguf, spec["prompts"], spec["max_new"], set(spec["stop"]))
    job.write_text(json.dumps({"completions": completions, "tokens_per_s": speed}))


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker(Path(sys.argv[2]), Path(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--types", nargs="+", default=["f16", "q8_0"])
    parser.add_argument("--out-dir", type=Path, default=Path("/tmp/gguf-bench"))
    parser.add_argument("--llama-python", default=sys.executable)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from grpo_plugin.publish.gguf import export_gguf
    from grpo_plugin.rollout.prompts import encode_prompts

    rows, reward, max_new = held_out(args.run_dir)
    tokenizer = AutoTokenizer.from_pretrained(args.run_dir)
    prompts = encode_prompts(tokenizer, list(rows["prompt"]))
    stop = {tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(["<|im_end|>"])} - {None}
    decode = lambda ids: [tokenizer.decode(c, skip_special_tokens=True) for c in ids]  # noqa: E731
    report = {"n": len(prompts), "max_new_tokens": max_new}
    report["hf_fp32"] = accuracy(
        reward, rows, decode(hf_greedy(args.run_dir, prompts, max_new, stop))
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for quant in args.types:
        paths = export_gguf(args.run_dir, args.out_dir / f"run-{quant}.gguf", quant, overwrite=True)
        completions, speed = run_llama(args.llama_python, paths.gguf, prompts, max_new, stop)
        report[quant] = {
            "accuracy": accuracy(reward, rows, decode(completions)),
            "decode_tokens_per_s": round(speed, 1),
            "file_mib": round(paths.gguf.stat().st_size / 2**20, 1),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
