"""`cpu_memory_reuse`: malloc keeps freed memory for the next step, LM-head chunks under 32 MB."""

from __future__ import annotations

import platform
import resource
import sys
from types import SimpleNamespace

import pytest
import torch

from grpo_plugin import _compat
from grpo_plugin.training import cpu_memory

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def test_heap_chunk_size_keeps_float32_logits_under_32_mb():
    # (32 MiB - 4096) // (4 * V), rounded down to a power of two
    assert cpu_memory.heap_chunk_size(49152) == 128  # SmolLM2: 170 -> 128 (25.2 MB)
    assert cpu_memory.heap_chunk_size(151936) == 32  # Qwen2.5: 55 -> 32
    assert cpu_memory.heap_chunk_size(128256) == 64  # Llama 3: 65 -> 64
    assert cpu_memory.heap_chunk_size(100) == 65536  # 83875 -> 65536
    assert cpu_memory.heap_chunk_size(10**8) == 1  # never 0
    for vocab in (49152, 151936, 262144):
        assert cpu_memory.heap_chunk_size(vocab) * vocab * 4 < _compat.HEAP_BLOCK_BYTES


def _fake_trainer(vocab: int, chunk: int, reuse: bool = True, device: str = "cpu"):
    model = torch.nn.Module()
    head = torch.nn.Linear(4, vocab, bias=False)
    model.get_output_embeddings = lambda: head
    args = SimpleNamespace(cpu_memory_reuse=reuse, logprob_chunk_size=chunk)
    accelerator = SimpleNamespace(device=torch.device(device))
    return SimpleNamespace(args=args, model=model, accelerator=accelerator)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_prepare_cuts_the_chunk_on_a_cpu_only_when_on():
    trainer = _fake_trainer(49152, 1024)
    cpu_memory.prepare(trainer)
    assert trainer.args.logprob_chunk_size == 128
    smaller = _fake_trainer(49152, 64)  # a smaller configured chunk is kept
    cpu_memory.prepare(smaller)
    assert smaller.args.logprob_chunk_size == 64
    off = _fake_trainer(49152, 1024, reuse=False)
    cpu_memory.prepare(off)
    assert off.args.logprob_chunk_size == 1024
    gpu = _fake_trainer(49152, 1024, device="meta")  # not a CPU: left alone
    cpu_memory.prepare(gpu)
    assert gpu.args.logprob_chunk_size == 1024


def _faults_of_a_fresh_20_mb_tensor() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(5 * 2**20).fill_(1.0)  # 20 MiB, written, freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_freed_memory_is_reused_without_page_faults():
    from grpo_plugin.rollout import isolation

    # a user-code worker an earlier test forked shares this process's pages: the first write to
    # each would fault once (copy-on-write), whatever malloc does; that is not what this measures
    isolation.shared_worker().stop()
    assert _compat.reuse_freed_cpu_memory() is True
    assert _compat.reuse_freed_cpu_memory() is True  # idempotent
    for _ in range(3):  # the heap grows to hold it
        _faults_of_a_fresh_20_mb_tensor()
    faults = [_faults_of_a_fresh_20_mb_tensor() for _ in range(3)]
    # Fresh pages would be 5120 faults of 4 KiB each time; reused heap memory faults none.
    assert max(faults) < 200, faults


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_training_on_a_cpu_applies_it(tiny_tokenizer, tmp_path):
    from conftest import make_trainer

    trainer = make_trainer(tiny_tokenizer, tmp_path, max_steps=1)
    trainer.train()
    assert _compat._REUSE_APPLIED == [True]
    assert trainer.args.logprob_chunk_size == 1024  # a tiny vocabulary's chunk already fits
