"""Two machines, proven on this one: two `accelerate launch` commands on loopback, `--machine_rank
0` and `--machine_rank 1`, one process each, with the shipped recipes/accelerate/multi_node.yaml
(only its address, port and process count changed: 2 machines x 1 CPU process, gloo).

- They train like one process with the same global batch (distributed_worker.py's `equal-grpo`).
- An output_dir that is not one folder on both machines is named on both, in one line, before step
  1. Machine 1 runs in a mount namespace of its own where the system lets us make one (`unshare`),
  with its own empty folder mounted at the run's path: the same path, another folder, as with a
  local path on each real machine. Elsewhere the two processes are given different paths.
- `distributed_type: MULTI_CPU` (accelerate starts one independent process per launch there) is
  refused in one line on both machines; nothing trains.

Each launch has a timeout, so a hang fails instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO_ROOT, load_script
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("distributed_worker.py")
SHIPPED = REPO_ROOT / "recipes" / "accelerate" / "multi_node.yaml"
TIMEOUT_S = 400  # far above a normal run; only a hang gets there
UNSHARED_RECIPE = """\
model: {model}
lora: {{r: 8, lora_alpha: 16, target_modules: all-linear}}
dataset: {{name: arithmetic, train_size: 8, eval_size: 5}}
reward_funcs: ["distributed_worker:length_score"]
eval: {{k: 0, batch_size: 8, before: false}}
num_generations: 4
per_device_train_batch_size: 8
max_steps: 2
max_completion_length: 6
save_strategy: 'no'
disable_tqdm: true
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_config(folder: Path, **changes) -> Path:
    """The shipped two-machine config on loopback: 1 process per machine instead of 8 GPUs."""
    config = yaml.safe_load(SHIPPED.read_text())
    config.update(main_process_ip="127.0.0.1", main_process_port=_free_port(), num_processes=2)
    config.update(changes)
    path = folder / "machines.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def mount_namespace(local: Path) -> list[str] | None:
    """A command prefix that runs a command with its own empty folder mounted at `local` (a mount
    namespace; a user namespace too when not root), or None where the system refuses one."""
    if shutil.which("unshare") is None:
        return None
    mount = 'mount -t tmpfs tmpfs "$0" && exec "$@"'
    for flags in (["--mount"], ["--map-root-user", "--mount"]):
        prefix = ["unshare", *flags, "--propagation", "private", "sh", "-c", mount, str(local)]
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def launch_machines(
    config: Path, args: list[str], tmp: Path, machine_1_prefix: list[str] = ()
) -> list[subprocess.CompletedProcess]:
    """`accelerate launch --machine_rank K ARGS` for K = 0, 1 at once (machine 1's command after
    `machine_1_prefix`); on timeout each whole process group is killed, launchers and workers."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",  # 2 processes x 2 threads thrash on 2 cores
        "HF_HOME": str(tmp / "hf-home"),  # no user accelerate config is read
        "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")]),
    }
    procs = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
        cmd += ["--machine_rank", str(rank), "--dynamo_backend", "no", *args]
        cmd = [*machine_1_prefix, *cmd] if rank == 1 else cmd
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=env,
                text=True,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
        )
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"2-machine run still running after {TIMEOUT_S}s (a hang)")
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory, tiny_model_dir) -> tuple[Path, bool]:
    """One 2-machine launch for the tests below; (its folder, whether machine 1 had a folder of
    its own mounted at OUT/local)."""
    out = tmp_path_factory.mktemp("two-machines")
    local = out / "local"
    local.mkdir()
    prefix = mount_namespace(local)
    same_path = prefix is not None  # else each process gets a path of its own
    run_dir = str(local / ("{phase}" if same_path else "{phase}-rank{{rank}}"))
    recipe = out / "unshared.yaml"
    recipe.write_text(UNSHARED_RECIPE.format(model=tiny_model_dir))
    phases = ["equal-grpo", f"unshared-trainer={run_dir.format(phase='trainer')}"]
    phases.append(f"unshared-cli={recipe},{run_dir.format(phase='cli')}")
    phases.append(f"recipe-error={recipe},{out / 'recipe-error-run'}")
    phases.append(f"cli-late={recipe},{out / 'cli-late-run'}")
    procs = launch_machines(
        machine_config(out), [str(WORKER), str(out), *phases], out, prefix or []
    )
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"machine {rank}:\n{proc.stderr[-4000:]}"
    return out, same_path


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    named = {name.removeprefix("module."): t.float() for name, t in tensors.items()}
    return torch.cat([named[name].flatten() for name in sorted(named)])


def test_two_machines_train_like_one_process(two_machines, tmp_path):
    """1 process x 16 completions (2 prompts x G=8) == 2 machines x 1 process x 8, 3 LoRA steps:
    the same completions at every step, the adapter within the two-process test's tolerance."""
    import pyarrow.parquet as pq

    worker = load_script(WORKER, "distributed_worker")
    one, two = tmp_path / "one", two_machines[0] / "equal-grpo"
    worker.train_and_record(one, "grpo", per_device=16)
    for step in range(worker.STEPS):
        name = f"completions/step_{step:05d}.parquet"
        table_one, table_two = pq.read_table(one / name), pq.read_table(two / name)
        assert table_two.num_rows == 16  # both machines' completions, gathered
        for column in ("prompt", "completion", "reward"):
            assert table_two.column(column) == table_one.column(column), (step, column)
    grad_diff = _relative(_flat(torch.load(two / "grad.pt")), _flat(torch.load(one / "grad.pt")))
    adapter_one = load_file(one / "adapter_model.safetensors")
    adapter_two = load_file(two / "adapter_model.safetensors")
    assert adapter_one.keys() == adapter_two.keys()
    adapter_diff = _relative(_flat(adapter_two), _flat(adapter_one))
    assert grad_diff < 1e-5, grad_diff
    assert adapter_diff < 1e-3, adapter_diff  # test_distributed_launch.py's bound
    print(f"2 machines vs 1 process: first gradient {grad_diff:.1e}, adapter {adapter_diff:.1e}")


def _reports(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{k}.json").read_text()) for k in range(2)]


def _run_dir(out: Path, same_path: bool, phase: str, rank: int) -> Path:
    """The output_dir process `rank` was given (the fixture's `run_dir`)."""
    return out / "local" / (phase if same_path else f"{phase}-rank{rank}")


def test_an_unshared_output_dir_stops_the_trainer_on_both_machines_before_step_1(two_machines):
    out, same_path = two_machines
    for rank, report in enumerate(_reports(out / "unshared-trainer")):
        assert report["type"] == "ValueError"
        expected = f"output_dir {_run_dir(out, same_path, 'trainer', rank)} is not one folder "
        assert report["message"].startswith(expected + "shared by every machine: process 1 (")
        assert report["steps"] == 0
    assert not list((out / "local").rglob("metrics.jsonl"))  # nothing trained, nothing written
    assert not list((out / "local").rglob(".grpo-plugin-shared-*"))  # the check's files removed
    print(f"machine 1 {'in a mount namespace' if same_path else 'on another path'}")


def test_an_unshared_output_dir_is_one_line_from_the_cli_on_both_machines(two_machines):
    out, same_path = two_machines
    for rank, report in enumerate(_reports(out / "unshared-cli")):
        assert report["code"] == 2
        lines = report["stderr"].splitlines()
        assert len(lines) == 1, report["stderr"]
        expected = f"error: output_dir {_run_dir(out, same_path, 'cli', rank)} is not one folder "
        assert lines[0].startswith(expected), lines[0]
        assert "mounts at the same path" in lines[0]  # the fix


def test_the_cli_on_two_machines_trains_into_one_shared_folder(two_machines):
    """Machine 1 reaching its checks late: it must not take process 0's lock for another run's
    (it did: each process checked the lock, and process 0 could hold it by then)."""
    out, _ = two_machines
    for report in _reports(out / "cli-late"):
        assert report["code"] == 0, report["stderr"]
        assert "error" not in report["stderr"].lower(), report["stderr"]
    run = out / "cli-late-run"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()]
    assert sorted(set(steps)) == [1, 2]
    assert (run / "adapter_model.safetensors").is_file()
    assert not list(run.glob(".grpo-plugin*"))  # the lock and the check's files are gone


def test_a_recipe_that_fails_on_one_machine_stops_both_with_its_line(two_machines):
    """A reward module missing on machine 1 alone: its error, on both (not a hang or a traceback
    about a closed connection on machine 0)."""
    out, _ = two_machines
    for report in _reports(out / "recipe-error"):
        assert report["code"] == 2
        [line] = report["stderr"].splitlines()
        assert line.startswith("error: ") and "missing_module_on_machine_1" in line, line
    assert not (out / "recipe-error-run").exists()


def test_multi_cpu_is_refused_in_one_line_on_both_machines(tmp_path, tiny_model_dir):
    """accelerate starts one process per launch for MULTI_CPU (without mpirun): each machine
    would train alone into the same output_dir. Both stop before any model loads."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(UNSHARED_RECIPE.format(model=tiny_model_dir))
    config = machine_config(tmp_path, distributed_type="MULTI_CPU")
    args = ["-m", "grpo_plugin", "train", str(recipe), "--output_dir", str(tmp_path / "run")]
    for rank, proc in enumerate(launch_machines(config, args, tmp_path)):
        assert proc.returncode != 0, f"machine {rank} trained:\n{proc.stdout[-2000:]}"
        ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(ours) == 1, proc.stderr[-4000:]
        assert "distributed_type: MULTI_GPU" in ours[0], ours[0]
        assert "grpo_plugin/" not in proc.stderr.split(ours[0])[0]  # no traceback of ours before
        assert "Traceback" not in proc.stderr.split(ours[0])[0]
    assert not (tmp_path / "run").exists()
