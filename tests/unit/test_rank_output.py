"""The warning hook: each warning text once per process, whichever line raises it."""

from __future__ import annotations

import logging

from slime_hydra.train.run.rank_output import show_once, shown_warnings


def test_a_warning_text_shows_once_whatever_its_location(caplog) -> None:
    text = "test_rank_output: Apex is not installed"
    with caplog.at_level(logging.WARNING, logger="py.warnings"):
        show_once(UserWarning(text), UserWarning, "a.py", 1)
        show_once(UserWarning(text), UserWarning, "b.py", 70)
        show_once(DeprecationWarning(text), DeprecationWarning, "b.py", 70)
    assert [r.getMessage() for r in caplog.records] == [
        f"UserWarning: {text} (a.py:1)",
        f"DeprecationWarning: {text} (b.py:70)",
    ]
    assert f"UserWarning: {text}" in shown_warnings()
