"""The settlement code as a zip for ``--py-files``: how Python code reaches executors.

A real cluster's workers share no working directory with the driver. The executors run
Python: the Kafka reader classifies messages with the sites' parser in Arrow batches
(``settlement.spark.parse``), which imports ``settlement`` and ``consumers``; Spark copies the
zip to each executor's work directory and puts it on that executor's ``sys.path``. Third-party
libraries are not in the zip: the workers' Python (``spark.pyspark.python``) must have the
locked environment installed (docs/architecture.md, "Running at scale").
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from settlement.config import PACKAGE_DIR, Settings

PACKAGES = ("settlement", "consumers")


def _sources() -> list[tuple[Path, str]]:
    """(file, name in the zip) for every .py file of the packages, in a stable order."""
    out: list[tuple[Path, str]] = []
    for name in PACKAGES:
        root = PACKAGE_DIR.parent / name
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts:
                out.append((path, path.relative_to(root.parent).as_posix()))
    return out


def python_files(settings: Settings) -> Path:
    """A zip of the packages under ``state_dir/spark/py``, named by its content's hash: the
    same code gives the same file (no rebuild per run), and concurrent builders never write
    into each other's file (each writes a private temporary and renames it)."""
    files = _sources()
    digest = hashlib.sha256()
    for path, arc in files:
        digest.update(arc.encode())
        digest.update(path.read_bytes())
    target = settings.state_dir / "spark" / "py" / f"settlement-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, arc in files:
            zf.write(path, arc)
    tmp.replace(target)
    return target
