"""The math-verify worker process behind the ``math`` reward (``reward_fns.math``).

Run as a script (``python _math_worker.py``; it imports nothing from ``reward_fns``), it answers
one JSON line per request on stdout: ``{"gold", "pred"}`` in, ``{"score": 1.0 | 0.0 | null}``
out, after a first ``{"ready": true}``. math-verify is called with its own timeouts off
(``parsing_timeout=None``, ``timeout_seconds=None``: they use ``signal.alarm``); the parent
enforces a wall-clock timeout and kills the process instead. math-verify's ``TimeoutException``
derives from ``BaseException``, hence the broad excepts.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def parse_gold(parse: Any, text: str) -> list:
    """The parsed gold answer; a bare LaTeX gold such as ``\\sqrt{8}`` is retried in ``$...$``."""
    try:
        gold = parse(text, parsing_timeout=None)
    except BaseException:
        gold = []
    if not gold and "\\" in text:
        try:
            gold = parse("$" + text + "$", parsing_timeout=None)
        except BaseException:
            gold = []
        gold = gold if gold and not isinstance(gold[0], str) else []
    return gold


def score(parse: Any, verify: Any, gold_text: str, pred_text: str) -> float | None:
    """1.0 equivalent, 0.0 not (or math-verify failed), None when the gold cannot be parsed."""
    gold = parse_gold(parse, gold_text)
    if not gold:
        return None
    try:
        pred = parse(pred_text, parsing_timeout=None)
        return float(bool(pred) and verify(gold, pred, timeout_seconds=None))
    except BaseException:
        return 0.0


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    try:
        from math_verify import parse, verify
    except BaseException as err:
        _reply({"error": repr(err)})
        return 1
    _reply({"ready": True})
    for line in sys.stdin:
        job = json.loads(line)
        _reply({"score": score(parse, verify, job["gold"], job["pred"])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
