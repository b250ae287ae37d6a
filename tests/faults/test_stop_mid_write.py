"""A stop (SIGINT/SIGTERM raising from its handler) that lands the instant a temporary file or
dir is created must still leave no temporary entry: the report's SIGTERM test once found a
`.x.png.<hex>.tmp` beside the figures. The signal is real; only its timing is staged."""

from __future__ import annotations

import os
import signal

import pytest

from slime_hydra import files


class Stopped(BaseException):
    pass


@pytest.fixture
def stop_on_sigterm():
    def stop(signum, frame):
        raise Stopped

    before = signal.signal(signal.SIGTERM, stop)
    yield
    signal.signal(signal.SIGTERM, before)


def signal_after(monkeypatch, name: str) -> None:
    """Send this process SIGTERM as soon as `os.<name>` returns (its handler raises there)."""
    real = getattr(os, name)

    def then_stop(*args, **kwargs):
        out = real(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)
        return out

    monkeypatch.setattr(files.os, name, then_stop)


def test_a_stop_right_after_a_temp_file_is_made_leaves_nothing(
    tmp_path, monkeypatch, stop_on_sigterm
):
    signal_after(monkeypatch, "open")
    with pytest.raises(Stopped):
        files.write_files({tmp_path / "a.json": "{}", tmp_path / "b.json": "[]"}, tmp_path)
    assert os.listdir(tmp_path) == []


def test_a_stop_right_after_a_temp_dir_is_made_leaves_nothing(
    tmp_path, monkeypatch, stop_on_sigterm
):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("old")
    signal_after(monkeypatch, "mkdir")
    with pytest.raises(Stopped):
        files.write_dir(tmp_path / "hf", lambda d: (d / "config.json").write_text("new"), tmp_path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["hf"]
    assert (tmp_path / "hf" / "config.json").read_text() == "old"
