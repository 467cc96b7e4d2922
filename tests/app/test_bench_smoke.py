"""Smoke test for benchmarks/vs_trl.py: the harness runs end to end and writes its JSON.

One step of each trainer on the tiny random model (no speed claim), plus one scaling cell.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO_ROOT, load_script

pytest.importorskip("trl")
HARNESS = REPO_ROOT / "benchmarks" / "vs_trl.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(HARNESS, "vs_trl")


def test_reward_matches_last_number():
    child = load_script(REPO_ROOT / "benchmarks" / "vs_trl_child.py", "vs_trl_child")
    completions = [[{"role": "assistant", "content": "3 + 4 = 7"}], "so 1,200.", "no idea", "7.5"]
    answers = ["7", "blah #### 1200", "3", "7"]
    assert child.exact_answer_reward(completions, answers) == [1.0, 1.0, 0.0, 0.0]


def test_child_flags_round_trip(bench):
    opts = bench.parse_args(["--model-dir", "/m", "--steps", "3", "--bf16"])
    flags = bench.child_flags(opts, config="short", max_new_tokens=7, fixed_length=True)
    child = bench.parse_args(["--child", "--trainer", "ours", *flags])
    assert (child.config, child.max_new_tokens, child.steps) == ("short", 7, 3)
    assert child.bf16 and child.fixed_length and not child.load_in_4bit
    assert child.micro_batch is None and not child.ours_auto_batch


def test_micro_batch_must_divide_the_rows_of_a_step(bench):
    child = load_script(REPO_ROOT / "benchmarks" / "vs_trl_child.py", "vs_trl_child")
    opts = bench.parse_args(["--micro-batch", "4"])  # 2 prompts x G=8 = 16 rows
    assert child.batch_split(opts) == {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
    }
    with pytest.raises(ValueError, match="must divide the 16 rows"):
        child.batch_split(bench.parse_args(["--micro-batch", "5"]))


def test_ours_micro_batch_splits_ours_only(bench):
    child = load_script(REPO_ROOT / "benchmarks" / "vs_trl_child.py", "vs_trl_child")
    opts = bench.parse_args(["--ours-micro-batch", "8"])
    flags = bench.child_flags(opts, config="short")
    ours = bench.parse_args(["--child", "--trainer", "ours", *flags])
    trl = bench.parse_args(["--child", "--trainer", "trl", *flags])
    assert child.batch_split(ours) == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
    }
    assert child.batch_split(trl) == {
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 1,
    }


def test_precision_of_each_child(bench):
    child = load_script(REPO_ROOT / "benchmarks" / "vs_trl_child.py", "vs_trl_child")

    def of(trainer: str, *argv: str) -> dict[str, bool]:
        return child.precision(bench.parse_args(["--child", "--trainer", trainer, *argv]))

    assert of("trl") == {"bf16": False, "bf16_weights": False}
    assert of("trl", "--trl-precision", "autocast") == {"bf16": True, "bf16_weights": False}
    assert of("trl", "--trl-precision", "bf16") == {"bf16": True, "bf16_weights": True}
    assert of("ours", "--trl-precision", "bf16") == {"bf16": False, "bf16_weights": False}
    assert of("ours", "--bf16") == of("trl", "--bf16") == {"bf16": True, "bf16_weights": True}
    opts = bench.parse_args(["--trl-precisions", "fp32", "autocast", "bf16"])
    assert bench.trl_names(opts) == {"trl": "fp32", "trl-autocast": "autocast", "trl-bf16": "bf16"}
    flags = bench.child_flags(opts, config="short", trl_precision="autocast")
    assert bench.parse_args(["--child", "--trainer", "trl", *flags]).trl_precision == "autocast"


def test_one_lockstep_step_of_each_trainer(bench, tiny_model_dir, tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--configs", "short", "--model-dir", str(tiny_model_dir), "--steps", "1",
            "--warmup", "0", "--max-new-tokens", "3", "--trl-precisions", "fp32", "bf16",
            "--out", str(out)]  # fmt: skip
    bench.main(argv)
    report = json.loads(out.read_text())
    short = report["results"]["short"]
    assert set(short["ratios"]) == {"trl", "trl-bf16"}
    assert short["fastest_trl"] in short["ratios"]
    assert short["ratio"] == short["ratios"][short["fastest_trl"]]
    for name in ("ours", "trl", "trl-bf16"):
        s = short[name]
        assert len(s["steps"]) == 1
        assert s["median_step_s"] > 0 and s["peak_rss_mb"] >= s["setup_rss_mb"] > 50
        assert s["peak_mb"] == s["peak_rss_mb"] and s["peak_gpu_mb"] is None  # CPU: RSS
        assert s["split"]["micro_batch"] == 16 and s["split"]["gradient_accumulation_steps"] == 1
        assert 0 < s["median_tokens"] <= 16 * 3  # 16 completions of at most 3 tokens
        parts = s["median_generate_s"] + s["median_score_s"] + s["median_train_s"]
        assert parts == pytest.approx(s["median_step_s"], rel=1e-6)
    assert short["ours"]["prompt_tokens"] == short["trl"]["prompt_tokens"] > 10
    assert len(short["ratio"]["step_time_pairs"]) == 1
    assert short["ratio"]["step_time"] > 0 and short["ratio"]["peak_memory"] > 0
    assert report["trl_args"]["use_vllm"] is False
    assert report["shared_args"]["gradient_checkpointing"] is False


def test_scaling_cell_decodes_full_length(bench, tiny_model_dir, tmp_path):
    out = tmp_path / "scaling.json"
    argv = ["--scaling", "--lengths", "5", "--groups", "2", "--scaling-steps", "1",
            "--warmup", "0", "--model-dir", str(tiny_model_dir), "--out", str(out)]  # fmt: skip
    bench.main(argv)
    (cell,) = json.loads(out.read_text())["scaling"]
    assert (cell["max_new_tokens"], cell["num_generations"]) == (5, 2)
    assert cell["median_tokens"] == 2 * 2 * 5  # EOS ignored: 2 prompts x G=2 x 5 tokens


def test_micro_batches_for_trl_and_the_autopilot_for_ours(bench, tiny_model_dir, tmp_path):
    out = tmp_path / "split.json"
    argv = ["--configs", "short", "--model-dir", str(tiny_model_dir), "--steps", "1",
            "--warmup", "0", "--max-new-tokens", "3", "--micro-batch", "4",
            "--ours-auto-batch", "--trl-precisions", "fp32", "--out", str(out)]  # fmt: skip
    bench.main(argv)
    short = json.loads(out.read_text())["results"]["short"]
    assert short["trl"]["split"]["micro_batch"] == 4
    assert short["trl"]["split"]["gradient_accumulation_steps"] == 4
    ours = short["ours"]["split"]  # the tiny model fits: the autopilot takes all 16 rows at once
    assert ours["micro_batch"] * ours["gradient_accumulation_steps"] == 16
    assert ours["micro_batch"] == 16
    for name in ("ours", "trl"):
        assert 0 < short[name]["median_tokens"] <= 16 * 3  # still 16 completions per step
