"""`grpo-plugin train` as a hostile user runs it: killed with SIGKILL after checkpoint 2 and
resumed, stopped with SIGTERM and resumed, started twice into one folder, rerun into a used one."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

RECIPE = """\
model: {model}
dataset: {{name: arithmetic, train_size: 16, eval_size: 0}}
reward_funcs: ["faulty_reward:mean_code"]
num_generations: 4
per_device_train_batch_size: 8
max_steps: 5
max_completion_length: 6
learning_rate: 0.03
lora: {{r: 4, lora_alpha: 8, target_modules: all-linear}}
save_strategy: steps
save_steps: 2
log_completions: true
disable_tqdm: true
output_dir: {out}
"""
# A reward with signal for a random tiny model (the mean character code), which kills or
# signals its own process when the environment asks, while step FAULT_STEP + 1 is sampled, or
# (EVAL_TERM=before/after) sends SIGTERM when it scores the evaluation before/after training.
REWARD = """
import os, signal
import reward_fns

@reward_fns.in_process  # the signals are for the trainer's process, not the worker's
def mean_code(prompts, completions, trainer_state=None, **kw):
    in_eval = trainer_state is None
    when = "after" if os.environ.get("TRAINED") else "before"
    if in_eval and os.environ.get("EVAL_TERM", "").split("-")[0] == when:  # "before-sigint": ^C
        sig = signal.SIGINT if os.environ["EVAL_TERM"].endswith("sigint") else signal.SIGTERM
        os.kill(os.getpid(), sig)
    if not in_eval:
        os.environ["TRAINED"] = "1"
    step = -1 if in_eval else trainer_state.global_step
    if os.environ.get("FAULT") and step == int(os.environ["FAULT_STEP"]):
        for _ in range(2 if os.environ["FAULT"] == "SIGINT2" else 1):  # SIGINT2: a double Ctrl-C
            os.kill(os.getpid(), getattr(signal, os.environ["FAULT"].removesuffix("2")))
    return score(completions)


def score(completions):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(map(ord, t)) / (128 * max(1, len(t))) for t in texts]



def group_term(prompts, completions, trainer_state, **kw):  # in the worker process
    if os.environ.get("FAULT") and trainer_state.global_step == int(os.environ["FAULT_STEP"]):
        # what a scheduler sends: the trainer's whole process group (the worker has its own)
        os.killpg(os.getpgid(os.getppid()), signal.SIGTERM)
    return score(completions)


def constant(prompts, completions, **kw):
    return [0.5] * len(completions)
"""
NOT_COMPARED = ("timing/", "generation/tokens_per_s", "train_", "step_time")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("recipe")
    (folder / "faulty_reward.py").write_text(REWARD)
    path = folder / "recipe.yaml"
    path.write_text(RECIPE.format(model=tiny_model_dir, out="{out}"))
    return path


def train(recipe: Path, out: Path, *flags: str, fault: str = "", step: int = 2, term: str = ""):
    text = recipe.read_text().replace("{out}", str(out))
    run_recipe = recipe.with_name(f"{out.name}.yaml")
    run_recipe.write_text(text)
    # TRAINED: the reward's own flag, which this module's in-process runs set in os.environ
    env = {**os.environ, "PYTHONPATH": str(recipe.parent), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "FAULT": fault, "FAULT_STEP": str(step), "EVAL_TERM": term,
           "TRAINED": ""}  # fmt: skip
    command = [sys.executable, "-m", "grpo_plugin", "train", str(run_recipe), *flags]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=300, start_new_session=True
    )  # fmt: skip  (a group of its own to signal)


def metric_lines(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in rows]


def completions(out: Path) -> dict[str, list]:
    files = sorted((out / "completions").glob("*.parquet"))
    return {f.name: pq.read_table(f).to_pylist() for f in files}


def weights_diff(a: Path, b: Path) -> float:
    """Max |difference| of the saved LoRA adapters."""
    x, y = (load_file(p / "adapter_model.safetensors") for p in (a, b))
    return max((x[k] - y[k]).abs().max().item() for k in x)


@pytest.fixture(scope="module")
def uninterrupted(recipe):
    out = recipe.parent / "straight"
    done = train(recipe, out)
    assert done.returncode == 0, done.stderr
    return out


def test_the_same_seed_gives_the_same_run(recipe, tmp_path, uninterrupted):
    again = train(recipe, tmp_path / "again")
    assert again.returncode == 0, again.stderr
    assert metric_lines(tmp_path / "again") == metric_lines(uninterrupted)
    assert completions(tmp_path / "again") == completions(uninterrupted)
    assert weights_diff(tmp_path / "again", uninterrupted) == 0.0  # LoRA's init is seeded too
    moved = load_file(uninterrupted / "adapter_model.safetensors")
    assert max(v.abs().max().item() for k, v in moved.items() if "lora_B" in k) > 0  # it trained


def test_sigkill_after_checkpoint_2_then_resume_equals_the_uninterrupted_run(
    recipe, tmp_path, uninterrupted
):
    out = tmp_path / "killed"
    killed = train(recipe, out, fault="SIGKILL")
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    assert [r["step"] for r in metric_lines(out)] == [1, 2]
    resumed = train(recipe, out, "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert metric_lines(out) == metric_lines(uninterrupted)  # steps 1..5, once each
    assert completions(out) == completions(uninterrupted)
    assert weights_diff(out, uninterrupted) == 0.0


def test_sigterm_saves_prints_how_to_resume_and_exits_143(recipe, tmp_path, uninterrupted):
    out = tmp_path / "preempted"
    stopped = train(recipe, out, fault="SIGTERM", step=2)
    assert stopped.returncode == 143, stopped.stderr
    assert "Stopped by SIGTERM after step 3; checkpoint saved to" in stopped.stderr
    assert "--resume_from_checkpoint true" in stopped.stderr.splitlines()[-1]
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()  # saved outside save_steps
    assert not (out / "README.md").exists()  # no card for an unfinished run
    resumed = train(recipe, out, "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert metric_lines(out) == metric_lines(uninterrupted)
    assert weights_diff(out, uninterrupted) == 0.0


def test_sigterm_to_the_process_group_during_a_worker_reward_stops_cleanly(recipe, tmp_path):
    """The user-code worker ignores SIGTERM: the trainer saves, stops with 143, and the worker
    dies with it (a reward error 'ended its worker process' would be the wrong outcome)."""
    out = tmp_path / "group"
    stopped = train(recipe, out, "--reward_funcs", "faulty_reward:group_term", fault="1", step=2)
    assert stopped.returncode == 143, stopped.stderr
    assert "Stopped by SIGTERM after step 3; checkpoint saved to" in stopped.stderr
    assert "ended its worker process" not in stopped.stderr


def test_a_rerun_into_a_used_folder_is_refused_then_overwrite_starts_clean(
    recipe, uninterrupted, tmp_path, monkeypatch, capsys
):
    from grpo_plugin import cli

    out = tmp_path / "used"
    shutil.copytree(uninterrupted, out)
    monkeypatch.syspath_prepend(str(recipe.parent))
    path = tmp_path / "used.yaml"
    path.write_text(recipe.read_text().replace("{out}", str(out)))
    assert cli.main(["train", str(path)]) == 0  # finished and whole: nothing to do
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{out} holds a finished run: 5 steps, no held-out set evaluated. ")
    assert line.endswith(
        "or train it further with --resume_from_checkpoint true and a larger --max_steps."
    )
    assert metric_lines(out) == metric_lines(uninterrupted)
    (out / "adapter_model.safetensors").unlink()  # as if killed before the final save
    assert cli.main(["train", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: output_dir {out} already holds a run (metrics.jsonl, grpo_run.json, "
        "completions, eval.json, ...); resume it with --resume_from_checkpoint true, replace it "
        "with --overwrite_output_dir, or choose another output_dir."
    ]
    assert metric_lines(out) == metric_lines(uninterrupted)  # nothing of it was touched
    assert cli.main(["train", str(path), "--overwrite_output_dir", "--max_steps", "2"]) == 0
    assert [r["step"] for r in metric_lines(out) if "loss" in r] == [1, 2]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]


def test_a_second_concurrent_run_is_refused(recipe, tmp_path):
    out = tmp_path / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, json, os, time
            os.makedirs({str(out)!r}, exist_ok=True)
            fd = os.open({str(out / '.grpo-plugin.lock')!r}, os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, json.dumps({{"pid": os.getpid(), "host": "h", "started": "s"}}).encode())
            print("held", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = train(recipe, out, "--dry-run")
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode == 2
    assert f"in use by another run (pid {holder.pid} on h, started s)" in refused.stderr


def learning_rates(out: Path) -> dict[int, float]:
    return {r["step"]: r["learning_rate"] for r in metric_lines(out) if "loss" in r}


def test_a_checkpoint_without_its_optimizer_is_refused_before_the_model_loads(
    recipe, uninterrupted, tmp_path
):
    out = tmp_path / "no-optimizer"
    shutil.copytree(uninterrupted, out)
    shutil.rmtree(out / "checkpoint-5")  # the final one: resume from checkpoint-4
    (out / "checkpoint-4" / "optimizer.pt").unlink()
    refused = train(recipe, out, "--resume_from_checkpoint", "true")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: {out}/checkpoint-4 has no optimizer.pt, and an exact resume needs all of "
        "optimizer.pt, scheduler.pt, trainer_state.json, grpo_state_0.pt: restore the file(s), "
        f"resume from the earlier complete checkpoint with --resume_from_checkpoint "
        f"{out}/checkpoint-2, or pass --resume_as_new_phase true to continue without them "
        "(not exactly)."
    ]  # one line, before "Loading model"
    assert metric_lines(out) == metric_lines(uninterrupted)


def test_a_changed_num_generations_is_refused_then_recorded_as_a_second_phase(
    recipe, uninterrupted, tmp_path
):
    out = tmp_path / "new-g"
    shutil.copytree(uninterrupted, out)
    for later in ("checkpoint-4", "checkpoint-5"):
        shutil.rmtree(out / later)  # resume from checkpoint-2
    flags = ("--resume_from_checkpoint", "true", "--num_generations", "2")
    refused = train(recipe, out, *flags)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: {out}/checkpoint-2 was trained with another config: num_generations 4 -> 2; "
        "resuming would mix two runs under one record. Resume with the checkpoint's values, "
        "start a new run (another output_dir, or overwrite_output_dir), or pass "
        "--resume_as_new_phase true to continue from step 2 as a new phase recorded in "
        "grpo_run.json."
    ]
    phased = train(recipe, out, *flags, "--resume_as_new_phase", "true")
    assert phased.returncode == 0, phased.stderr
    run = json.loads((out / "grpo_run.json").read_text())
    assert run["objective"]["num_generations"] == 2  # the last phase's, and the phases say so:
    assert run["phases"] == [
        {"phase": 1, "from_step": 0},
        {"phase": 2, "from_step": 2, "changed": {"num_generations": [4, 2]}},
    ]
    header = (out / "recipe.yaml").read_text().splitlines()[1:3]
    assert header == [
        "# This run has 2 phases (grpo_run.json `phases`); this recipe is the last one's, "
        "from step 3.",
        "# Phase 1 (steps 1-2) ran with num_generations: 4.",
    ]


def test_raising_max_steps_on_resume_continues_the_schedule(recipe, tmp_path):
    out = tmp_path / "longer"
    first = train(recipe, out, "--max_steps", "4")  # checkpoint-4: the end of the decay
    assert first.returncode == 0, first.stderr
    longer = train(recipe, out, "--resume_from_checkpoint", "true", "--max_steps", "6")
    assert longer.returncode == 0, longer.stderr
    lr = learning_rates(out)
    assert [lr[s] for s in (1, 4)] == [0.03, pytest.approx(0.03 / 4)]  # the first 4 steps' decay
    assert lr[5] == pytest.approx(0.03 * 2 / 6) and lr[6] == pytest.approx(0.03 / 6)  # not 0.0
    assert "max_steps 4 -> 6" in longer.stderr and "step 5 trains at learning rate 0.01" in (
        longer.stderr
    )


def test_after_a_double_ctrl_c_the_next_run_says_the_one_way_out(recipe, tmp_path):
    """Two SIGINTs before the first checkpoint: no traceback, and every next message points the
    same way (start over), never back and forth between "resume it" and "drop the flag"."""
    out = tmp_path / "run"
    aborted = train(recipe, out, fault="SIGINT2", step=1)  # step 1 logged, no checkpoint
    assert aborted.returncode == 130, aborted.stderr[-2000:]
    assert "Traceback" not in aborted.stderr
    last = aborted.stderr.strip().splitlines()[-1]
    assert "no checkpoint was saved" in last and "--overwrite_output_dir" in last
    for flags in ((), ("--resume_from_checkpoint", "true")):
        again = train(recipe, out, *flags)
        assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
        assert "--overwrite_output_dir" in again.stderr and "resume it" not in again.stderr
        assert "drop the flag" not in again.stderr and "no complete checkpoint" in again.stderr
    done = train(recipe, out, "--overwrite_output_dir")  # following the advice works
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "adapter_model.safetensors").is_file()


# --- the run folder (issue 45): a resume loses no record, one timeline, no user file written over


def test_a_damaged_checkpoint_is_refused_in_one_line_and_nothing_is_cut(
    recipe, uninterrupted, tmp_path
):
    """Before: a truncated optimizer.pt ended in a traceback after metrics.jsonl and
    completions/ were cut back to checkpoint-4, and the steps after it were lost for good."""
    out = tmp_path / "damaged"
    shutil.copytree(uninterrupted, out)
    shutil.rmtree(out / "checkpoint-5")
    optimizer = out / "checkpoint-4" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    expected = [
        f"error: {optimizer} is damaged: its archive is cut short or corrupt (File is not a zip "
        "file). Nothing was changed; restore the file from a copy, or resume from the earlier "
        f"whole checkpoint with --resume_from_checkpoint {out}/checkpoint-2."
    ]
    for flags in (("--dry-run",), ()):
        refused = train(recipe, out, "--resume_from_checkpoint", "true", *flags)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines() == expected
        assert "Loading model" not in refused.stdout + refused.stderr
    assert metric_lines(out) == metric_lines(uninterrupted)  # nothing was cut
    assert completions(out) == completions(uninterrupted)
    resumed = train(recipe, out, "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert resumed.returncode == 0, resumed.stderr
    assert metric_lines(out) == metric_lines(uninterrupted)
    assert weights_diff(out, uninterrupted) == 0.0


def test_true_never_resumes_a_checkpoint_of_an_abandoned_timeline(recipe, uninterrupted, tmp_path):
    """Before: resume from checkpoint-2 to step 3 with a new learning rate, then `true` picked the
    old run's checkpoint-5 without a word; metrics.jsonl lost the new step 3 and mixed two runs."""
    out = tmp_path / "branched"
    shutil.copytree(uninterrupted, out)
    branch = ("--resume_from_checkpoint", str(out / "checkpoint-2"), "--max_steps", "3")
    done = train(recipe, out, *branch, "--learning_rate", "0.01")
    assert done.returncode == 0, done.stderr
    assert "checkpoint-4, checkpoint-5, 4 line(s) of metrics.jsonl" in done.stderr
    (aside,) = (out / "abandoned").iterdir()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    new_step_3 = learning_rates(out)[3]
    more = ("--resume_from_checkpoint", "true", "--max_steps", "6", "--learning_rate", "0.01")
    longer = train(recipe, out, *more)
    assert longer.returncode == 0, longer.stderr
    assert "Resuming at step 3 " in longer.stderr  # the new timeline's newest checkpoint
    lr = learning_rates(out)
    assert sorted(lr) == [1, 2, 3, 4, 5, 6] and lr[3] == new_step_3  # one continuous history
    assert [r["step"] for r in metric_lines(out) if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert learning_rates(aside) == {s: learning_rates(uninterrupted)[s] for s in (3, 4, 5)}
    assert sorted(p.name for p in aside.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]
    assert weights_diff(aside, uninterrupted) == 0.0  # its final adapter, kept aside


def test_a_users_files_in_output_dir_are_never_written_over(recipe, tmp_path):
    """Before: the user's README.md and recipe.yaml were replaced by the card and the recipe."""
    out = tmp_path / "project"
    out.mkdir()
    (out / "README.md").write_text("# My project\n")
    (out / "recipe.yaml").write_text("mine: true\n")
    for flags in (("--dry-run",), (), ("--allow_other_files_in_output_dir", "true")):
        refused = train(recipe, out, "--max_steps", "1", *flags)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
            f"error: output_dir {out} holds README.md, recipe.yaml, which no run of grpo-plugin "
            "wrote and which a run writes (the model card, the recipe as run, the weights, ...): "
            "nothing was written; move the file(s) away, or choose an empty or new output_dir."
        ]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "recipe.yaml"]
    assert (out / "README.md").read_text() == "# My project\n"
    (out / "README.md").rename(out / "NOTES.md")
    (out / "recipe.yaml").rename(out / "my-recipe.yaml")
    refused = train(recipe, out, "--max_steps", "1")
    assert refused.returncode == 2 and "--allow_other_files_in_output_dir true" in refused.stderr
    beside = train(recipe, out, "--max_steps", "1", "--allow_other_files_in_output_dir", "true")
    assert beside.returncode == 0, beside.stderr
    assert (out / "NOTES.md").read_text() == "# My project\n" and (out / "README.md").is_file()


def test_a_changed_reward_is_refused_before_the_model_loads(recipe, uninterrupted, tmp_path):
    """Before: --dry-run said OK, and the real run refused only after the model had loaded."""
    out = tmp_path / "new-reward"
    shutil.copytree(uninterrupted, out)
    for later in ("checkpoint-4", "checkpoint-5"):
        shutil.rmtree(out / later)
    flags = ("--resume_from_checkpoint", "true", "--reward_funcs", "faulty_reward:constant")
    for extra in (("--dry-run",), ()):
        refused = train(recipe, out, *flags, *extra)
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert "reward_funcs ['mean_code'] -> ['constant']" in line
        assert "Loading model" not in refused.stdout + refused.stderr
    assert metric_lines(out) == metric_lines(uninterrupted)


def test_train_seconds_counts_the_whole_run_after_a_resume(recipe, tmp_path):
    """Before: eval.json's train_seconds counted only the resumed part."""
    out = tmp_path / "timed"
    killed = train(recipe, out, fault="SIGKILL")
    assert killed.returncode == -signal.SIGKILL
    record_file = out / "checkpoint-2" / "grpo_resume.json"
    record = json.loads(record_file.read_text())
    assert record["train_seconds"] > 0
    record["train_seconds"] = 1000.0  # as if steps 1-2 had taken that long
    record_file.write_text(json.dumps(record))
    resumed = train(recipe, out, "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "eval.json").read_text())["train_seconds"] >= 1000.0


EVALUATED = ("--dataset.eval_size", "4", "--eval.k", "0", "--max_steps", "2")


def test_sigterm_during_the_evaluation_before_training_says_so_in_one_line(recipe, tmp_path):
    """Before: exit 143 and not a word."""
    out = tmp_path / "term-before"
    stopped = train(recipe, out, *EVALUATED, term="before")
    assert stopped.returncode == 143, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert (
        stopped.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "Stopped by SIGTERM during the evaluation before training; no checkpoint was saved. "
            "Nothing was trained; to start again: grpo-plugin train "
        )
    )
    again = train(recipe, out, *EVALUATED)  # the command it gives works
    assert again.returncode == 0, again.stderr


def test_sigterm_during_the_evaluation_after_training_keeps_the_run_and_resume_finishes_it(
    recipe, tmp_path
):
    out = tmp_path / "term-after"
    stopped = train(recipe, out, *EVALUATED, term="after")
    assert stopped.returncode == 143, stopped.stderr
    assert "Traceback" not in stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"Stopped by SIGTERM during the evaluation after training; the run is saved up to "
        f"{out}/checkpoint-2. To resume: grpo-plugin train "
    ) and last.endswith("--resume_from_checkpoint true")
    finished = train(recipe, out, *EVALUATED, "--resume_from_checkpoint", "true")
    assert finished.returncode == 0, finished.stderr
    evaluation = json.loads((out / "eval.json").read_text())
    assert "after" in evaluation and "before" in evaluation


@pytest.mark.parametrize(
    ("where", "signals"),
    [("the evaluation before training", {"term": "before-sigint"}),
     ("step 1, eval.json written", {"fault": "SIGINT2", "step": 0})],
)  # fmt: skip
def test_ctrl_c_before_anything_trained_proposes_the_plain_command_and_it_works(
    recipe, tmp_path, where, signals
):
    """Issue 56: after Ctrl-C during the first evaluation the hint proposed
    --overwrite_output_dir for a folder with nothing to lose."""
    out = tmp_path / "aborted"
    aborted = train(recipe, out, *EVALUATED, **signals)
    assert aborted.returncode == 130, aborted.stderr[-2000:]
    last = aborted.stderr.strip().splitlines()[-1]
    assert last.startswith("Aborted; nothing was trained. To start again: grpo-plugin train "), last
    assert "--overwrite_output_dir" not in last
    again = train(recipe, out, *EVALUATED)  # the command it gives works
    assert again.returncode == 0, again.stderr[-2000:]
    assert "after" in json.loads((out / "eval.json").read_text())


@contextlib.contextmanager
def one_torch_thread():
    """An in-process run compared with a subprocess run at OMP_NUM_THREADS=1: torch's sums depend
    on the thread count (`make test` sets none)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_a_full_disk_mid_run_is_one_line_and_nothing_saved_is_lost(
    recipe, uninterrupted, tmp_path, monkeypatch, capsys
):
    """Before: a traceback. The disk fills while the completions of step 4 are written."""
    import pyarrow.parquet as pq

    from grpo_plugin import cli

    out = tmp_path / "full"
    monkeypatch.syspath_prepend(str(recipe.parent))
    path = tmp_path / "full.yaml"
    path.write_text(recipe.read_text().replace("{out}", str(out)))
    write = pq.write_table

    def full_disk(table, where, **kwargs):
        if "step_00003.parquet" in str(where):
            raise OSError(errno.ENOSPC, "No space left on device")  # as pyarrow: no file named
        return write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", full_disk)
    with one_torch_thread():  # as `uninterrupted`, a subprocess at OMP_NUM_THREADS=1
        assert cli.main(["train", str(path)]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(
            f"error: Could not write {out}/completions/step_00003.parquet in {out}: no space "
            "left on the device ("
        ) and line.endswith(
            "Saved checkpoints are intact (checkpoint-2); free some space or set "
            "save_total_limit, then resume with --resume_from_checkpoint true."
        )
        monkeypatch.setattr(pq, "write_table", write)  # space freed
        assert cli.main(["train", str(path), "--resume_from_checkpoint", "true"]) == 0
    assert metric_lines(out) == metric_lines(uninterrupted)
    assert completions(out) == completions(uninterrupted)
    assert weights_diff(out, uninterrupted) == 0.0
