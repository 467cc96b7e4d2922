"""`torch_threads`: the free cores read from /proc/stat, the count chosen from them, the config's
values and the CLI's default (a resume taking back its checkpoint's count: run/test_resume.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch
from conftest import REPO_ROOT, TINY_CLI_RECIPE

from grpo_plugin import GRPOConfig
from grpo_plugin.engine import cpu_threads

LOGGER = "grpo_plugin.engine.cpu_threads"


@pytest.fixture(autouse=True)
def keep_thread_count(monkeypatch):
    """Each test may set torch's process-wide thread count; it is put back after."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


def stat_lines(*cpus: tuple[int, int]) -> str:
    """A /proc/stat with an aggregate line and one line per CPU of (busy, idle) jiffies."""
    rows = [f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0" for i, (busy, idle) in enumerate(cpus)]
    return "\n".join(["cpu 1 2 3 4 5 6 7 8 9 10", *rows, "intr 1 2 3", "ctxt 99"]) + "\n"


def test_free_cores_counts_the_idle_time_of_the_allowed_cpus(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(stat_lines((100, 100), (100, 100), (100, 100)))
    # Over the window: cpu0 all idle, cpu1 all busy, cpu2 (not ours) all idle.
    later = stat_lines((100, 200), (200, 100), (100, 200))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(time, "sleep", lambda s: stat.write_text(later))
    assert cpu_threads.free_cores(stat=stat) == pytest.approx(1.0)  # 2 x 100 idle / 200 total


def test_free_cores_is_none_where_proc_stat_cannot_be_read(tmp_path):
    assert cpu_threads.free_cores(0.0, stat=tmp_path / "missing") is None


@pytest.mark.parametrize(
    "current, free, expected",
    [
        (2, 1.97, 2),
        (2, 1.02, 1),
        (2, 1.49, 1),
        (2, 0.05, 1),
        (2, 3.9, 2),
        (8, 5.6, 6),
        (2, None, 2),
    ],
)
def test_auto_takes_the_free_cores_rounded_at_least_one_at_most_the_processes(
    current, free, expected
):
    assert cpu_threads.auto_threads(current, free) == expected


def test_a_busy_process_beside_us_leaves_one_core_fewer():
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to share")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        free = cpu_threads.free_cores()
    finally:
        busy.kill()
        busy.wait()
    assert free is not None and free < cores - 0.5
    assert cpu_threads.auto_threads(cores, free) <= cores - 1


def test_an_omp_num_threads_the_user_set_is_kept_by_auto(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(cpu_threads, "free_cores", lambda: pytest.fail("must not look"))
    assert cpu_threads.choose("auto") == (torch.get_num_threads(), "auto keeps OMP_NUM_THREADS")
    assert cpu_threads.choose(None) is None  # the process's setting, as TRL


@pytest.mark.parametrize(
    "value, expected", [(None, None), ("none", None), ("auto", "auto"), ("3", 3), (1, 1)]
)
def test_the_config_takes_none_auto_or_a_count(tmp_path, value, expected):
    assert GRPOConfig(output_dir=str(tmp_path), torch_threads=value).torch_threads == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", 1.5, "", "2.0"])
def test_a_bad_thread_count_is_one_line_naming_the_field(tmp_path, value):
    with pytest.raises(ValueError) as bad:
        GRPOConfig(output_dir=str(tmp_path), torch_threads=value)
    assert str(bad.value).startswith(f"torch_threads={value!r} must be 'auto'")
    assert "\n" not in str(bad.value)


def test_a_recipe_defaults_to_auto_and_a_flag_pins_it(tmp_path):
    from grpo_plugin.app.recipe import RecipeError, load_recipe

    recipe = str(REPO_ROOT / "recipes" / "arithmetic.yaml")
    assert load_recipe(recipe, []).config.torch_threads == "auto"
    assert load_recipe(recipe, ["--torch_threads", "1"]).config.torch_threads == 1
    with pytest.raises(RecipeError, match=r"^torch_threads='0' must be 'auto'"):
        load_recipe(recipe, ["--torch_threads", "0"])
    yaml_recipe = tmp_path / "threads.yaml"
    yaml_recipe.write_text("dataset: {name: arithmetic}\ntorch_threads: 2\n")
    assert load_recipe(str(yaml_recipe), []).config.torch_threads == 2  # a YAML integer
    assert load_recipe(recipe, ["--torch_threads", "null"]).config.torch_threads is None


def test_the_cli_beside_a_busy_process_trains_with_a_thread_fewer(tmp_path, tiny_model_dir):
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to share")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_CLI_RECIPE.format(model=tiny_model_dir, out=tmp_path / "out"))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpo_plugin",
                "train",
                str(recipe),
                "--max_steps",
                "1",
                "--report",
                "false",
            ],
            env={**env, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        busy.kill()
        busy.wait()
    assert run.returncode == 0, run.stderr[-2000:]
    chosen = re.search(r"torch threads: (\d+) \(auto: ([\d.]+) of (\d+) cores free", run.stderr)
    assert chosen, run.stderr[-2000:]
    assert int(chosen[1]) < cores and int(chosen[3]) == cores


def test_each_process_of_a_multi_process_launch_keeps_its_count(monkeypatch):
    monkeypatch.setattr(cpu_threads, "free_cores", lambda: pytest.fail("must not look"))
    assert cpu_threads.choose("auto", processes=2) == (
        torch.get_num_threads(),
        "auto keeps each of 2 processes' own",
    )
