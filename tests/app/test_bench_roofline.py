"""benchmarks/roofline.py: the work formulas on hand-computed numbers, and one step of the tiny
model end to end (no speed claim)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO_ROOT, load_script

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def bench():
    return load_script(REPO_ROOT / "benchmarks" / "roofline.py", "roofline")


def shape(bench, **overrides):
    """A LoRA model: 1000 base weights, 100 adapter weights (rank 4), a frozen 500-weight head."""
    fields = dict(served=1000, adapters=100, trainable=100, head=500, head_trainable=False,
                  layers=2, attention_width=8, kv_width=4, trainable_params=100, synced=800,
                  rank=4)  # fmt: skip
    return bench.ModelShape(**{**fields, **overrides})


def test_training_flops_lora_and_full(bench):
    tokens = bench.Tokens(body=10, head=6, attended=20)
    assert bench.attention_flops(shape(bench), 20) == 4 * 2 * 8 * 20  # x layers x width x pairs
    lora = shape(bench)
    # 10 x (4 x 1000 frozen + 6 x 100 adapters) + 6 x 500 x 4 + 3 x 1280
    assert bench.train_flops(lora, tokens) == 46_000 + 12_000 + 3_840
    full = shape(bench, adapters=0, trainable=1000, head_trainable=True)
    assert bench.train_flops(full, tokens) == 60_000 + 18_000 + 3_840  # 6 P T
    # the forward alone: 2 x (1000 + 100) x 10 + 2 x 500 x 6 + 1280
    assert bench.forward_flops(lora, tokens) == 22_000 + 6_000 + 1_280


def test_decode_bytes_are_weights_per_step_plus_kv(bench):
    counts = bench.Counts(decode_steps=3, decode_rows=12, decode_columns=120,
                          kv_element_bytes=2, copy_precision="bf16")  # fmt: skip
    work = bench.decode_work(shape(bench), counts, weight_bytes=2, dtype="bfloat16")
    # (1000 + 500 head) x 2 bytes x 3 steps + 120 columns x 2 (K, V) x 2 layers x 4 x 2 bytes
    assert work.bytes == 9_000 + 3_840
    assert work.flops == 2 * 1500 * 12 + 4 * 2 * 8 * 120
    from_policy = bench.Counts(decode_steps=3, decode_rows=12, decode_columns=0)
    assert bench.decode_work(shape(bench), from_policy, 4, "float32").bytes == 1600 * 4 * 3


def test_sync_optimizer_and_prefill_work(bench):
    assert bench.sync_work(shape(bench), syncs=2, copy_bytes=2).bytes == (4 + 2) * 800 * 2
    assert bench.sync_work(shape(bench), syncs=2, copy_bytes=2).flops == 2 * 4 * 800 * 2
    assert bench.optimizer_work(shape(bench)).bytes == 32 * 100
    counts = bench.Counts(prefill_tokens=7, prefill_rows=2, prefill_attended=16,
                          copy_precision="bf16")  # fmt: skip
    assert bench.prefill_work(shape(bench), counts, "bfloat16").flops == (
        2 * 1000 * 7 + 2 * 500 * 2 + 4 * 2 * 8 * 16
    )


def test_roofline_takes_the_binding_limit(bench):
    limits = bench.Limits(bandwidth=10e9, peak={"float32": 100e9, "bfloat16": 400e9})
    memory = bench.roofline(1.0, bench.Work(flops=100e9, bytes=5e9), limits)  # 1 s vs 0.5 s
    assert memory["limit"] == "float32" and memory["fraction"] == pytest.approx(1.0)
    bound = bench.roofline(2.0, bench.Work(flops=100e9, bytes=5e9, dtype="bfloat16"), limits)
    assert bound["limit"] == "memory" and bound["fraction"] == pytest.approx(0.25)
    assert bench.roofline(1.0, bench.Work(), limits)["fraction"] is None
    # 100 GFLOP of which 80 in bf16: 20 / 100e9 + 80 / 400e9 = 0.4 s at the mix's limit
    mixed = bench.roofline(0.8, bench.Work(flops=100e9, bf16_flops=80e9), limits)
    assert mixed["limit"] == "float32+bf16" and mixed["fraction"] == pytest.approx(0.5)
    assert mixed["limit_rate"] == pytest.approx(250e9)  # 100 GFLOP / 0.4 s


def test_bf16_training_counts_the_frozen_base_products_at_the_bf16_peak(bench):
    tokens = bench.Tokens(body=10, head=4, attended=0)
    counts = bench.Counts(train=tokens, logprob=tokens, logprob_passes=1)
    fp32 = bench.phase_work(shape(bench), counts, bench.torch.float32)
    bf16 = bench.phase_work(shape(bench), counts, bench.torch.float32, bf16_training=True)
    assert fp32["forward_backward"].bf16_flops == 0
    assert bf16["forward_backward"].flops == fp32["forward_backward"].flops
    served = shape(bench).served
    assert bf16["forward_backward"].bf16_flops == 4 * served * 10  # dx and y per base weight
    assert bf16["logprobs"].bf16_flops == 2 * served * 10


def test_batch_tokens_count_each_shared_prompt_once(bench):
    import torch

    class Batch:
        prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
        completion_mask = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0]])

        def __len__(self):
            return 4

    t = bench.batch_tokens(Batch(), group=2)  # prompts of 2 and 3 tokens, each once
    assert (t.body, t.head) == (2 + 3 + 5, 5)
    # prompts 3 + 6 pairs; completions x prompt 2x2 + 1x2 + 2x3; completions 3 + 1 + 3
    assert t.attended == 9 + 12 + 7


def test_one_step_on_the_tiny_model(bench, tiny_model_dir, tmp_path):
    out = tmp_path / "roofline.json"
    argv = ["--configs", "short", "--model-dir", str(tiny_model_dir), "--steps", "1",
            "--warmup", "0", "--max-new-tokens", "3", "--num-generations", "2",
            "--prompts-per-step", "2", "--triad-mib", "24", "--matmul-n", "128",
            "--out", str(out)]  # fmt: skip
    bench.main(argv)
    report = json.loads(out.read_text())
    assert report["cpu"] and report["date"] and report["torch"] and report["threads"] >= 1
    limits = report["limits"]
    assert limits["triad_gbps"] > 0 and limits["float32_gflops"] > 0
    assert limits["bfloat16_gflops"] > 0
    result = report["results"]["short"]
    phases = result["phases"]
    assert set(phases) == set(bench.PHASES)
    assert all(p["seconds"] >= 0 for p in phases.values())
    assert sum(p["seconds"] for p in phases.values()) <= 1.05 * result["step_s"]
    for p in phases.values():
        assert p["fraction"] is None or math.isfinite(p["fraction"])
    assert result["furthest"] in phases and result["largest_gap"] in phases
    assert phases["decode"]["seconds"] > 0 and phases["forward_backward"]["flops"] > 0
    (counts,) = result["counts"]
    assert counts["completion_tokens"] <= 4 * 3 and counts["decode_steps"] <= 2
