"""`_logging.visible`: text from a dataset, a model or a user's code printed to a terminal shows
its control characters instead of letting the terminal act on them."""

from __future__ import annotations

import logging

from grpo_plugin._logging import CurrentStderrHandler, visible

# Retitle the window, clear the screen, write the clipboard (OSC 52), a one-byte CSI, a CR that
# overwrites the line, and a right-to-left override.
HOSTILE = "Q\x1b]0;TITLE\x07\x1b[2J\x1b]52;c;aGk=\x07\x9b31m\rX\u202eY"


def test_every_character_a_terminal_acts_on_is_written_as_its_escape():
    shown = visible(HOSTILE)
    assert shown == r"Q\x1b]0;TITLE\x07\x1b[2J\x1b]52;c;aGk=\x07\x9b31m\x0dX\u202eY"
    assert all(c.isprintable() for c in shown)


def test_tabs_newlines_and_ordinary_unicode_are_kept():
    text = "a\tb\nc é 漢字 🙂"
    assert visible(text) == text


def test_log_records_reach_stderr_with_escapes_shown(capsys):
    logger = logging.getLogger("grpo_plugin.test_visible")
    handler = CurrentStderrHandler()
    logger.addHandler(handler)
    try:
        logger.warning("prompt %r too long", HOSTILE)  # %r already escapes; %s does not
        logger.warning("prompt %s too long", HOSTILE)
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err
    assert err.count("\n") == 2 and r"\x1b]0;TITLE" in err
