"""The code stays ruff-clean (the style the design brief asks for)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def test_ruff_is_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    res = subprocess.run([str(ruff), "check", "settlement", "consumers", "dags", "tests",
                          "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
