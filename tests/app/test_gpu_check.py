"""benchmarks/gpu_check.py: the phases' plumbing (the whole dry run is `gpu_check.py --device
cpu --dry-run`, a few minutes; its output is in the README)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, load_script

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def check():
    return load_script(SCRIPT, "gpu_check")


def test_step_seconds_sum_the_logged_parts_of_each_step(check, tmp_path):
    rows = [
        {"step": 1, "timing/generate_s": 1.0, "timing/reward_s": 0.25, "timing/train_s": 0.5},
        {"step": 1, "eval_accuracy": 0.5},  # an evaluation line: no step timing
        {"step": 2, "timing/generate_s": 2.0, "timing/reward_s": 0.0, "timing/train_s": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert check.step_seconds(tmp_path) == [1.75, 3.0]


def test_a_call_names_its_phases_and_a_limit_can_be_raised(check):
    opts = check.parse_args(["--device", "cpu", "--call", "2", "--limit", "demo=175"])
    assert opts.phases == ["vs_trl", "big", "overlap", "decode"] and opts.limit == {"demo": 175.0}
    with pytest.raises(SystemExit):
        check.parse_args(["--device", "cpu", "--limit", "demo"])


def test_dry_run_shrinks_every_phase_but_keeps_its_flags(check):
    opts = check.parse_args(["--device", "cpu", "--dry-run", "--model-dir", "/m", "--out", "/o"])
    argv = check.vs_trl_argv(opts, check.Path("/o/vs_trl.json"), big=False)
    assert argv[argv.index("--device") + 1] == "cpu" and "--bf16" not in argv  # TRL in float32
    assert argv[argv.index("--steps") + 1] == "1" and argv[argv.index("--warmup") + 1] == "0"
    assert argv[argv.index("--configs") + 1 : argv.index("--configs") + 3] == ["short", "long"]
    big = check.vs_trl_argv(opts, check.Path("/o/big.json"), big=True)
    assert "--fixed-length" in big and "long" not in big and "--bf16" in big
    full = check.vs_trl_argv(check.parse_args(["--device", "cpu", "--model-dir", "/m"]),
                             check.Path("/o/x.json"), big=False)  # fmt: skip
    assert full[full.index("--steps") + 1] == "3"
    flags = check.recipe_overrides(opts, check.Path("/o/demo"), 2)
    assert flags[flags.index("--max_steps") + 1] == "2" and "--dataset.eval_size" in flags
    assert (
        flags[flags.index("--use_cpu") + 1] == "true" and flags[flags.index("--model") + 1] == "/m"
    )
    # each device call fits in 10 minutes with room to install, and both in 15 minutes of device time
    assert [sum(check.LIMITS[p] for p in check.CALLS[c]) for c in (1, 2)] == [320, 420]
    assert sorted(check.CALLS[1] + check.CALLS[2]) == sorted(check.PHASES)


def test_the_table_names_every_phase_and_its_status(check):
    report = {"phases": {
        "tests": {"status": "ok", "seconds": 12.5, "log": "tests.log", "passed": 5},
        "demo": {"status": "timeout", "seconds": 110, "log": "demo.log"},
        "big": {"status": "ok", "seconds": 50.0, "log": "big.log",
                "short": {"step_ratio": 0.41234, "memory_ratio": 0.5}},
    }}  # fmt: skip
    table = check.format_table(report).splitlines()
    assert table[2] == "| tests | ok | 12.5 | passed 5 |"
    assert table[3] == "| demo | timeout | 110 |  |"
    assert table[4] == "| big | ok | 50.0 | short {step_ratio 0.412, memory_ratio 0.5} |"


def test_a_failing_phase_is_recorded_and_the_next_one_runs(check, tmp_path):
    opts = check.parse_args(["--device", "cpu", "--dry-run", "--out", str(tmp_path),
                             "--model-dir", str(tmp_path / "no-such-model")])  # fmt: skip
    opts.phases = ["demo", "big"]
    report = check.run_all(opts)
    for name in ("demo", "big"):  # no model there: both fail, each with its own log
        phase = report["phases"][name]
        assert phase["status"] == "failed" and (tmp_path / phase["log"]).is_file()
        assert phase["error"]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["phases"].keys() == {"demo", "big"}
    assert "| demo | failed |" in (tmp_path / "gpu_check.md").read_text()


def test_cuda_without_a_gpu_says_how_to_check_on_a_cpu():
    pytest.importorskip("torch").cuda.is_available() and pytest.skip("this machine has a GPU")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "--device cpu --dry-run" in done.stderr
