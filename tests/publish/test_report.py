"""report.html: the data it is built from (groups, per-function rewards, the step a table trains),
its bad input, and the page itself in a real headless browser (skipped without chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RUN_INFO, write_run_files

from grpo_plugin import cli
from grpo_plugin.publish.report import (
    ReportError,
    _decoded,
    _group_bounds,
    report_data,
    write_report,
)
from grpo_plugin.run import rundir
from grpo_plugin.run.lock import LOCK_FILE

HOSTILE = "</script><script>document.title='owned'</script>"
INFO = {**RUN_INFO, "objective": {**RUN_INFO["objective"], "num_generations": 4}}


def completions_table(run: Path, step: int, prompts: list[str], rewards: list[list[float]]):
    """One logged rollout: a group of 4 per prompt, rewards per function [last_integer, format]."""
    records: dict[str, list] = {k: [] for k in ("step", "prompt", "completion", "reward",
                                                "advantage", "rewards/last_integer",
                                                "rewards/format")}  # fmt: skip
    for g, prompt in enumerate(prompts):
        totals = [r + 0.5 * f for r, f in rewards[g]]
        mean = sum(totals) / 4
        for i, (r, f) in enumerate(rewards[g]):
            records["step"].append(step)
            records["prompt"].append([{"role": "user", "content": prompt}])
            records["completion"].append([{"role": "assistant", "content": f"answer {g}.{i}"}])
            records["reward"].append(totals[i])
            records["advantage"].append(totals[i] - mean)
            records["rewards/last_integer"].append(r)
            records["rewards/format"].append(f)
    rundir.write_completions_parquet(rundir.completions_file(run, step), records)


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished run: 3 logged rollouts (steps 0-2) of 2 groups x G=4."""
    path = write_run_files(tmp_path / "run", run_info=INFO, steps=3)
    won = [(1.0, 1.0), (0.0, 1.0), (0.0, 0.0), (0.0, 1.0)]  # one winner: right and well formed
    flat = [(0.0, 0.0)] * 4  # no signal
    for step in range(3):
        completions_table(path, step, [f"What is {step} + 1?", HOSTILE], [won, flat])
    return path


def test_the_data_has_every_step_group_and_reward(run):
    data = report_data(run)
    assert [s["step"] for s in data["steps"]] == [1, 2, 3]  # table step_00000 trains step 1
    assert data["rewardNames"] == ["last_integer", "format"]
    assert data["rewardWeights"] == [1.0, 0.5]
    groups = data["steps"][0]["groups"]
    assert len(groups) == 2 and [len(g["rows"]) for g in groups] == [4, 4]
    first = groups[0]["rows"][0]
    assert first[0] == [{"role": "assistant", "content": "answer 0.0"}]
    assert first[1] == pytest.approx(1.5) and first[3] == [1.0, 1.0]
    assert first[2] == pytest.approx(1.5 - (1.5 + 0.5 + 0.0 + 0.5) / 4)
    assert len(data["prompts"]) == 4  # 3 arithmetic prompts + the shared hostile one, once
    assert data["metrics"]["train"]["step"] == [1, 2, 3]
    assert data["metrics"]["eval"]["eval_accuracy"] == [0.5]
    assert data["run"]["weights"] is None and data["run"]["training"] is None


def test_only_chat_messages_are_decoded():
    messages = [{"role": "user", "content": "hi"}]
    assert _decoded(json.dumps(messages)) == messages
    for text in ("[1, 2]", "[not json", "plain", '{"a": 1}'):  # plain-text prompts stay text
        assert _decoded(text) == text


def test_groups_fall_back_to_runs_of_one_prompt():
    assert _group_bounds(["a"] * 4 + ["b"] * 4, 4) == [(0, 4), (4, 8)]
    # G unknown or not matching the rows (a dynamic-sampling refill, an older run): by prompt
    assert _group_bounds(["a", "a", "b", "b", "b"], 4) == [(0, 2), (2, 5)]
    assert _group_bounds(["a", "a", "b", "b"], None) == [(0, 2), (2, 4)]


def test_the_page_embeds_text_that_cannot_end_its_script(run):
    page = write_report(run).read_text()
    assert HOSTILE not in page and "</script><script>document" not in page
    assert page.count("</script>") == 2  # the data block's and the code's own
    blob = re.search(r'id="run-data">(.*?)</script>', page, re.DOTALL).group(1)
    assert json.loads(blob)["prompts"][1][0]["content"] == HOSTILE  # intact once parsed


def test_a_damaged_table_is_counted_not_fatal(run):
    rundir.completions_file(run, 3).write_bytes(b"PAR1 cut short")
    data = report_data(run)
    assert data["unreadableTables"] == 1 and len(data["steps"]) == 3


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_bad_input_gets_one_line(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    assert f"run dir {tmp_path / 'nope'} does not exist" in _one_error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no run: no metrics.jsonl, completions/ or eval.json" in _one_error_line(capsys)
    (tmp_path / "file.txt").write_text("not a run")
    with pytest.raises(ReportError, match="is not a directory"):
        write_report(tmp_path / "file.txt")


def test_a_run_without_weights_is_reported(run, capsys):
    assert cli.main(["report", str(run)]) == 0
    assert f"Wrote {run / 'report.html'}" in capsys.readouterr().out
    assert '"weights":null' in (run / "report.html").read_text()  # the page says: no weights yet


HOLD_LOCK = """
import fcntl, json, os, socket, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "now"}).encode())
print("held", flush=True)
sys.stdin.read()
"""


def test_a_run_in_progress_is_reported_so_far_and_says_so(run, caplog):
    """Another process holds the run's lock (as a training run does: run/lock.py)."""
    command = [sys.executable, "-c", HOLD_LOCK, str(run / LOCK_FILE)]
    holder = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level("WARNING"):
            page = write_report(run).read_text()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert "is still training (pid" in caplog.text and "up to step 3" in caplog.text
    assert f'"training":"pid {holder.pid} on ' in page


# ----------------------------------------------------------------------------- in a browser

CHROMIUM = next(
    (b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
)
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars"]  # fmt: skip


def browser(page: Path, profile: Path, *flags: str, fragment: str = "") -> str:
    """Chromium on `page` (a fresh profile); returns its stdout (the DOM with --dump-dom)."""
    command = [CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={profile}", *flags,
               page.resolve().as_uri() + fragment]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")
def test_the_page_renders_in_a_real_browser(run, tmp_path):
    page = write_report(run)
    dom = browser(page, tmp_path / "profile", "--dump-dom")
    counts = re.search(r'<footer id="counts"([^>]*)>', dom).group(1)
    for name, value in (("steps", 3), ("groups", 6), ("completions", 24), ("prompts", 4)):
        assert f'data-{name}="{value}"' in counts
    groups = re.search(r'<div id="groups"([^>]*)>', dom).group(1)
    assert 'data-shown="2"' in groups and 'data-step="3"' in groups  # the last step first
    assert dom.count('class="tag won"') == 1  # one group had a winner, the other none
    assert "no signal: every reward equal" in dom
    assert "1 of 2 groups had rewards that differ" in dom
    assert "&lt;/script&gt;&lt;script&gt;document.title" in dom  # shown as text, not run
    assert "<title>run: GRPO run report</title>" in dom
    assert re.search(r"<svg[^>]*aria-label=\"reward by step\"", dom)  # the curve
    assert 'id="eval-table"' in dom and 'id="curve-table"' not in dom  # no curve in eval.json
    step1 = browser(page, tmp_path / "profile", "--dump-dom", fragment="#step=1&group=2")
    assert re.search(r'<div id="groups"[^>]*data-shown="1"', step1)
    assert re.search(r'<div id="groups"[^>]*data-step="1"', step1)
    shot = tmp_path / "shot.png"
    browser(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _with_outcomes(run: Path, last: dict[str, float]) -> None:
    """Rewrite metrics.jsonl with code_tests' outcome shares: step 1 all syntax errors, the last
    step `last`."""
    prefix = "outcome/code_tests/"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()[:-1]]
    for row in rows:
        if "reward" in row:
            shares = {"syntax_error": 1.0, "passed": 0.0} if row["step"] == 1 else last
            row.update({prefix + k: v for k, v in shares.items()})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")
def test_the_page_says_why_programs_failed(run, tmp_path):
    _with_outcomes(run, {"syntax_error": 0.25, "passed": 0.75})
    dom = browser(write_report(run), tmp_path / "profile", "--dump-dom")
    assert re.search(r"<svg[^>]*aria-label=\"code_tests outcomes by step\"", dom)
    row = re.search(r'<tr data-outcome="syntax_error">(.*?)</tr>', dom).group(1)
    assert re.findall(r'class="num">([^<]*)<', row) == [
        "100.0%",
        "25.0%",
        "50.0%",
    ]  # (1 + .25 + .25) / 3
    assert "At step 3 every program" not in dom  # the script holds the sentence, not "3"
    _with_outcomes(run, {"syntax_error": 0.0, "passed": 0.0, "timeout": 1.0})
    broken = browser(write_report(run), tmp_path / "profile2", "--dump-dom")
    assert "At step 3 every program crashed or timed out" in broken


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")
def test_a_run_without_outcomes_has_no_outcome_section(run, tmp_path):
    dom = browser(write_report(run), tmp_path / "profile", "--dump-dom")
    assert re.search(r'<section id="outcomes-section" hidden', dom)
