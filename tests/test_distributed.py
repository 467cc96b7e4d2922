"""The distributed helpers on one process: prompt shards, metric reduction, shared failures, the
backend check. The multi-process proofs are in test_distributed_launch.py."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from accelerate.data_loader import BatchSamplerShard
from conftest import REPO_ROOT
from torch.utils.data import BatchSampler

from grpo_plugin import distributed
from grpo_plugin._compat import launched_without_accelerators
from grpo_plugin.core.batching import PromptBatchSampler


def _per_process_batches(num_shards: int, prompts_per_process: int, repeats: int = 1):
    """What each process's dataloader yields: accelerate's sharding of our sampler."""
    sampler = PromptBatchSampler(12, prompts_per_process, repeats, seed=3, num_shards=num_shards)
    batches = BatchSampler(sampler, prompts_per_process, drop_last=False)
    return [list(BatchSamplerShard(batches, num_shards, k)) for k in range(num_shards)]


def test_each_step_has_the_same_global_prompts_on_any_number_of_processes():
    [one] = _per_process_batches(1, 4)  # 1 process x 4 prompts per rollout
    two = _per_process_batches(2, 2)  # 2 processes x 2
    four = _per_process_batches(4, 1)  # 4 processes x 1
    assert len(one) == len(two[0]) == len(four[0]) == 3  # 12 prompts / 4 per step
    for step, block in enumerate(one):
        assert two[0][step] + two[1][step] == block  # process k: global positions k*P ..
        assert [four[k][step][0] for k in range(4)] == block


def test_repeated_rollout_batches_stay_on_their_process():
    """With 2 micro-steps per rollout each process sees its own shard twice, never the other's."""
    two = _per_process_batches(2, 2, repeats=2)
    for k in range(2):
        assert two[k][0] == two[k][1] and two[k][2] == two[k][3]
    assert not set(two[0][0]) & set(two[1][0])


def test_a_dataset_smaller_than_one_global_rollout_is_refused():
    with pytest.raises(ValueError, match="one rollout on 4 processes needs 8"):
        PromptBatchSampler(6, 2, 1, num_shards=4)


def test_metrics_are_summed_kept_or_averaged():
    per_process = [
        {"reward": 0.5, "timing/generate_s": 1.0, "dynamic_sampling/filtered_groups": 3.0},
        {"reward": 0.5, "timing/generate_s": 3.0, "dynamic_sampling/filtered_groups": 1.0},
        {"reward": 0.5, "timing/generate_s": 2.0, "kl": 0.3, "dynamic_sampling/filtered_groups": 0},
    ]
    assert distributed.combine_metrics(per_process) == {
        "reward": 0.5,  # the same everywhere (computed from the gathered rollout): kept
        "timing/generate_s": 2.0,  # averaged
        "dynamic_sampling/filtered_groups": 4.0,  # summed
        "kl": 0.3,  # reported by one process only
    }


def test_one_process_helpers_are_identities():
    one = SimpleNamespace(num_processes=1, process_index=0)
    assert distributed.own_share([5, 6, 7], one) == [5, 6, 7]
    assert distributed.gather_objects(one, {"a": 1}) == [{"a": 1}]
    assert distributed.mean_over_processes(one, 7.0) == 7.0
    assert distributed.global_prompt_offset(one, 4) == 0
    assert distributed.reduce_metrics(one, {"reward": 1.0}) == {"reward": 1.0}
    with pytest.raises(KeyError):  # a single process raises its own error, untouched
        with distributed.failures_shared(one):
            raise KeyError("x")


def test_own_share_is_disjoint_and_complete():
    procs = [SimpleNamespace(num_processes=3, process_index=k) for k in range(3)]
    shares = [distributed.own_share(list(range(10)), p) for p in procs]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert distributed.global_prompt_offset(procs[2], 4) == 8


def test_zero3_is_refused_with_the_fix():
    zero3 = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3)))
    with pytest.raises(ValueError, match="fsdp2_lora.yaml"):
        distributed.check_backend(zero3)
    zero2 = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=2)))
    distributed.check_backend(zero2)


def test_zero3_is_refused_before_the_model_loads(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="ZeRO-3 shards the parameters"):
        distributed.check_launch(SimpleNamespace(deepspeed={"zero_optimization": {"stage": 3}}))
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 2}}')
    distributed.check_launch(SimpleNamespace(deepspeed=str(config)))  # ZeRO-2 is fine
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")  # set by `accelerate launch`
    with pytest.raises(ValueError, match="fsdp2_lora.yaml"):
        distributed.check_launch(SimpleNamespace(deepspeed=None))


def test_a_cpu_only_multi_process_launch_is_detected(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launched_without_accelerators()  # this machine has no GPU
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not launched_without_accelerators()


def test_a_process_started_alone_by_accelerate_is_detected(monkeypatch):
    """accelerate's simple launcher (MULTI_CPU, --cpu) sets ACCELERATE_USE_CPU, and MASTER_ADDR when
    several processes or machines were asked for; a launcher that started them sets a rank."""
    from grpo_plugin._compat import RANK_VARIABLES, launched_alone

    for name in (*RANK_VARIABLES, "ACCELERATE_USE_CPU", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert not launched_alone()  # python -m grpo_plugin, MASTER_ADDR exported: not accelerate's
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    assert launched_alone()
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")  # mpirun started them (--mpirun_hostfile)
    assert not launched_alone()
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    monkeypatch.delenv("MASTER_ADDR")
    assert not launched_alone()  # one process asked for


def test_main_process_decides_alone_in_a_one_process_run():
    one = SimpleNamespace(num_processes=1, process_index=0)
    assert distributed.on_main_process(one, lambda: "checkpoint-4") == "checkpoint-4"
    with pytest.raises(KeyError):
        distributed.on_main_process(one, lambda: {}["x"])


def test_unpicklable_errors_travel_as_runtime_errors():
    class Local(Exception):  # a class defined in a function cannot be pickled
        pass

    portable = distributed._portable(Local("boom"))
    assert type(portable) is RuntimeError and str(portable) == "Local: boom"
    error = ValueError("fine")
    assert distributed._portable(error) is error


@pytest.mark.parametrize(
    "path", sorted((REPO_ROOT / "recipes" / "accelerate").glob("*.yaml")), ids=lambda p: p.name
)
def test_accelerate_configs_load_and_say_when_to_use_them(path):
    from accelerate.commands.config.config_args import load_config_from_file

    assert path.read_text().startswith("# "), "a header comment says when to use the config"
    config = load_config_from_file(str(path))
    assert config.mixed_precision == "no"  # GRPOConfig.bf16 decides
    assert config.distributed_type.value in {"MULTI_GPU", "FSDP", "DEEPSPEED"}
    if config.distributed_type.value == "FSDP":
        assert config.fsdp_config["fsdp_version"] == 2


RELEASE_SCRIPT = """
import sys, weakref, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from grpo_plugin._compat import release_process_group
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
ddp = DistributedDataParallel(torch.nn.Linear(4, 2))
ddp(torch.ones(3, 4)).sum().backward()
ddp.cycle = ddp  # a finished trainer sits in cycles like this one (callbacks, tracebacks)
held = weakref.ref(ddp)
del ddp
print(held() is not None, end=" ")
release_process_group()
print(held() is not None, dist.is_initialized())
"""


def test_releasing_the_process_group_frees_what_still_holds_it(tmp_path):
    """A DDP wrapper in a reference cycle outlives its trainer and holds the gloo group; released
    at exit, it is freed while the interpreter is whole (not in finalization, where gloo aborts)."""
    proc = subprocess.run(
        [sys.executable, "-c", RELEASE_SCRIPT, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False", "False"]  # alive, then freed and destroyed


@pytest.mark.parametrize(
    ("micro", "group", "processes", "share", "held"),
    [
        (4, 8, 1, True, True),  # a group over 2 micro-batches: its prompt held
        (8, 8, 1, True, False),  # a whole group per micro-batch: nothing to hold
        (6, 8, 1, True, False),  # micro-batches cut groups unevenly (blocks of gcd = 2 rows)
        (1, 8, 1, True, False),  # one row: the prefix-shared forward does not run
        (4, 8, 2, True, False),  # DDP: a second backward in a step is refused by its reducer
        (4, 8, 1, False, False),  # share_prompt_prefix=False
    ],
)
def test_a_prompt_is_held_across_micro_batches_only_where_it_is_exact_and_allowed(
    micro, group, processes, share, held
):
    import torch

    from grpo_plugin.engine.prompt_grad import SharedPromptGrad

    args = SimpleNamespace(
        per_device_train_batch_size=micro, num_generations=group, share_prompt_prefix=share
    )
    accelerator = SimpleNamespace(num_processes=processes, is_fsdp2=False)
    store = SharedPromptGrad(group)
    assert (distributed.held_prompt(accelerator, args, store) is store) is held
    with torch.no_grad():  # the reference and old-policy passes: never held
        assert distributed.held_prompt(accelerator, args, store) is None
