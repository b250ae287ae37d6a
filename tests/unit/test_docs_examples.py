"""The Python examples of the planning and compat docs run as written (their asserts hold)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text())


@pytest.mark.parametrize(("page", "count"), [("planning.md", 2), ("compat.md", 1)])
def test_every_python_example_runs(page: str, count: int) -> None:
    found = blocks(page)
    assert len(found) == count
    for code in found:
        exec(compile(code, f"{page} example", "exec"), {})
