"""A warning printed while a progress bar is drawn on stderr goes above the bar, on a line of
its own, not into the bar's line (the bar is cleared, the warning written, the bar redrawn)."""

from __future__ import annotations

import io
import sys

from bertattn.cli import _above_bars


def test_a_warning_during_a_bar_gets_its_own_line(monkeypatch):
    from tqdm import tqdm

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar = tqdm(total=10, file=sys.stderr, mininterval=0)
    bar.update(3)
    _above_bars("bertattn encode: warning: 3 inputs were truncated")
    bar.update(3)
    bar.close()
    lines = err.getvalue().replace("\r", "\n").split("\n")
    assert "bertattn encode: warning: 3 inputs were truncated" in lines  # alone on its line
    assert lines.index("bertattn encode: warning: 3 inputs were truncated") > 0


def test_without_a_bar_it_is_a_plain_line(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    _above_bars("bertattn attend: warning: something")
    assert err.getvalue() == "bertattn attend: warning: something\n"
