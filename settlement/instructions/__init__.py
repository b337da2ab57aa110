"""Settlement instructions: a published day becomes what each account delivers or receives,
and pays or is paid, on its settlement date (T+N settlement business days), with the fails
reported by the settlement agent carried into the next settlement date until they settle.

``calendar`` (the settlement date), ``model`` (lines, signs, partials), ``store`` (written
once per published run, answers applied all or nothing), ``files`` (CSV and ISO 20022).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from settlement.config import Settings
from settlement.instructions.files import FORMATS, default_path, write
from settlement.instructions.store import instructions


def write_files(settings: Settings, trade_date: str,
                formats: tuple[str, ...] = FORMATS) -> dict[str, Any]:
    """The published day's instructions (written to the database on first use) as files
    beside the audit reports, one per format; what the DAG and the close call after a
    publication. Returns the set's summary with ``paths``."""
    day = instructions(settings, trade_date)
    paths = {fmt: str(write(day, fmt, default_path(Path(settings.reports_dir), day, fmt),
                            settings.settlement_currency)) for fmt in formats}
    return {**day.as_dict(), "paths": paths}
