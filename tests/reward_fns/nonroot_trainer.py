"""A trainer that is not root, for tests/reward_fns/test_sandbox_userns.py (a script, not a test).

    python nonroot_trainer.py REPO_ROOT < jobs.json > report.json

Run under a non-root uid (``setpriv --reuid=65534 ...`` when the tests run as root). Each job
scores completions with ``code_tests`` or runs one program with ``sandbox.run_python``, at a
given isolation; the report gives, per job, the scores or the output, and what the run left
behind. This process is a child subreaper, so a process that escaped a run's namespaces would
be re-parented here and show up as a child of ours; mounts and /tmp are compared as well.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36


def children() -> list[str]:
    """Our children, zombies included (a run must leave none, and must reap all it made)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            found.append(f"{entry}{fields[0]}")
    return found


def reap_strays() -> None:
    """Reap what an earlier job left to us (only between jobs: no run is in flight)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def traces() -> dict:
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    tmp = sorted(e for e in os.listdir("/tmp") if e.startswith("reward_fns-"))
    return {"children": children(), "mounts": mounts, "tmp": tmp}


def run_job(job: dict, sandbox, reward_fns) -> dict:
    hold = threading.Event()
    idle = [threading.Thread(target=hold.wait) for _ in range(job.get("trainer_threads", 0))]
    for thread in idle:  # tasks of the trainer's uid that a per-uid process cap would count
        thread.start()
    reap_strays()
    before = traces()
    try:
        if "program" in job:
            limits = sandbox.SandboxLimits(timeout_s=job["timeout_s"])
            result = sandbox.run_python(
                job["program"], job.get("stdin"), job.get("tests"), limits, job["isolation"]
            )
            out = {"stdout": result.stdout, "stderr": result.stderr[-2000:]}
            out.update(returncode=result.returncode, verdicts=result.verdicts)
        else:
            fn = reward_fns.get(
                "code_tests", isolation=job["isolation"], timeout_s=job["timeout_s"]
            )
            codes = [f"```python\n{code}\n```" for code in job["codes"]]
            out = {"scores": fn(["p"] * len(codes), codes, tests=job["tests"])}
    finally:
        hold.set()
        for thread in idle:
            thread.join()
    time.sleep(0.05)  # an escaped process would be re-parented to us by now
    after = traces()
    out["left"] = {key: [before[key], after[key]] for key in before if before[key] != after[key]}
    return out


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    import reward_fns
    from reward_fns import sandbox

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("reward_fns").addHandler(handler)
    logging.getLogger("reward_fns").setLevel(logging.INFO)
    report: dict = {"uid": os.getuid(), "why_not": sandbox._why_not("bwrap-user")}
    if report["why_not"]:
        print(json.dumps(report))
        return
    report["auto"] = sandbox.isolation_level("auto")
    report["strict"] = sandbox.isolation_level("strict")
    jobs = json.load(sys.stdin)
    report["jobs"] = {}
    for name, job in jobs.items():  # each with its wall time and log lines, for a failure's message
        first, start = len(lines), time.monotonic()
        report["jobs"][name] = run_job(job, sandbox, reward_fns)
        report["jobs"][name].update(seconds=round(time.monotonic() - start, 1), log=lines[first:])
    report["log"] = [line for line in lines if "code_tests sandbox: isolation=" in line]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
