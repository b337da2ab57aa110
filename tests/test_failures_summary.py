"""``make test`` prints every phase's failures again at its end (tests/failures.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_summary_names_each_failed_test_of_each_phase(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "def test_ok():\n    assert True\n\n"
        "def test_bad():\n    assert 1 == 2, 'one is not two'\n")
    junit = tmp_path / "junit-1-parallel.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    str(tmp_path / "test_sample.py"), f"--junitxml={junit}"],
                   cwd=tmp_path, capture_output=True, check=False)
    from tests.failures import failures, main

    lines = failures(junit)
    assert len(lines) == 1
    assert lines[0].startswith("junit-1-parallel: test_sample.py::test_bad: failure:")
    assert "one is not two" in lines[0]
    assert main([str(junit), str(tmp_path / "absent.xml")]) == 0


def test_no_failure_is_said_plainly(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from tests.failures import main

    main([str(tmp_path / "none.xml")])
    assert "no failed or erroring test" in capsys.readouterr().out
