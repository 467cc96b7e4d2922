"""code_tests throughput, before vs after, measured in the same run.

    flock /tmp/grpo-heavy.lock .venv/bin/python benchmarks/code_tests_throughput.py
    .venv/bin/python benchmarks/code_tests_throughput.py --before e060abc --rounds 3 --n 256
    .venv/bin/python benchmarks/code_tests_throughput.py --isolation pivot_root  # "after" only

The "before" package is ``git archive REF reward_fns``, unpacked into a temporary folder; the
"after" one is this checkout's. Each measurement is a fresh subprocess that imports one of them
and scores N completions (asserts: half right, half wrong, like tests/test_reward_code.py; and
stdin/stdout: one case each), after one warm-up call that pays for the sandbox's one-time probe.
The two alternate, round after round, so both see the same machine load; the report is each
side's median completions per second and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
import reward_fns
n, kind, params = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
fn = reward_fns.get("code_tests", timeout_s=5.0, **params)
if kind == "asserts":
    tests = ["assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4"] * n
    codes = [f"```python\ndef add(a, b):\n    return a + b + {i % 2}\n```" for i in range(n)]
    expected = [1.0 if i % 2 == 0 else 0.0 for i in range(n)]
else:
    tests = [[{"input": f"{i}\n", "output": f"{2 * i}\n"}] for i in range(n)]
    codes = ["```python\nprint(int(input()) * 2)\n```"] * n
    expected = [1.0] * n
fn(prompts=["p"], completions=codes[:1], tests=tests[:1])  # warm-up: probe, imports
start = time.perf_counter()
scores = fn(prompts=["p"] * n, completions=codes, tests=tests)
wall = time.perf_counter() - start
assert scores == expected, scores
print(json.dumps({"per_s": n / wall, "where": reward_fns.__file__}))
"""


SANDBOX_BEFORE = "e060abc"  # the parent of the minimal-root sandbox (issue 12)


def unpack_before(ref: str, into: str) -> str:
    archive = subprocess.run(
        ["git", "-C", HERE, "archive", "--format=tar", ref, "reward_fns"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into)
    return into


def measure(path_first: str, n: int, kind: str, params: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=path_first)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), kind, json.dumps(params)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--before",
        default=SANDBOX_BEFORE,
        help="git ref of the 'before' reward_fns (default: the last commit before issue 12's sandbox)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--kinds", default="asserts,stdio")
    parser.add_argument("--isolation", default="auto", help="code_tests isolation, after only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="code_tests_bench-") as tmp:
        before = unpack_before(args.before, tmp)
        for kind in args.kinds.split(","):
            rates: dict[str, list[float]] = {"before": [], "after": []}
            for r in range(args.rounds):
                order = [("before", before), ("after", HERE)]
                for side, path in order if r % 2 == 0 else order[::-1]:
                    params = {"isolation": args.isolation} if side == "after" else {}
                    result = measure(path, args.n, kind, params)
                    assert result["where"].startswith(path), result
                    rates[side].append(result["per_s"])
                    print(f"{kind} round {r + 1} {side:6s} {result['per_s']:6.1f}/s", flush=True)
            ratios = [a / b for a, b in zip(rates["after"], rates["before"])]
            print(
                f"{kind}: before {statistics.median(rates['before']):.1f}/s, after "
                f"{statistics.median(rates['after']):.1f}/s, after/before median "
                f"{statistics.median(ratios):.2f} over {args.rounds} rounds (n={args.n}, "
                f"after: isolation={args.isolation})"
            )


if __name__ == "__main__":
    main()
