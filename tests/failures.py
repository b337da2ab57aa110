"""The failed and erroring tests of every phase of ``make test``, printed again at its end.

The phases print thousands of lines; CI keeps the tail of its log, where the last phase's
summary would hide an earlier phase's failure. Each phase writes JUnit XML (``--junitxml``);
this prints one line per failure from them, or that there were none.

    python -m tests.failures .state/test/junit-*.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def failures(report: Path) -> list[str]:
    """``phase: nodeid: kind: first line of the message`` for each failed or erroring test."""
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            found = case.find(kind)
            if found is None:
                continue
            node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            message = (found.get("message") or found.text or "").strip().splitlines()
            out.append(f"{report.stem}: {node}: {kind}: {(message or [''])[0][:300]}")
    return out


def main(paths: list[str]) -> int:
    lines = []
    for p in map(Path, paths):
        if p.is_file():
            lines.extend(failures(p))
    print("make test: failed or erroring tests, every phase:" if lines
          else "make test: no failed or erroring test in any phase")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
