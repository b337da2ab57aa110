"""What the demo prints and which day it trades (pure: no services)."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from rich.console import Console

from settlement.config import Settings
from settlement.demo import _print_summary, _still_running
from settlement.instructions.calendar import latest_trading_day


@pytest.mark.parametrize(("today", "traded"), [
    ("2026-11-28", "2026-11-27"),  # a Saturday: the Friday before
    ("2026-11-26", "2026-11-25"),  # Thanksgiving: the exchange is shut
    ("2026-11-30", "2026-11-30"),  # a Monday session: today
    ("2027-01-01", "2026-12-31"),  # New Year's Day: last year's last session
])
def test_the_demo_trades_the_exchanges_latest_trading_day(today: str, traded: str) -> None:
    assert latest_trading_day("XNYS", dt.date.fromisoformat(today)).isoformat() == traded


def test_the_summary_prints_every_path_whole_and_what_is_left_running(tmp_path) -> None:
    deep = tmp_path / ("very-long-folder-name-" * 6) / "audit-2026-11-27-run1.html"
    out = io.StringIO()
    con = Console(file=out, width=60, force_terminal=False)
    _print_summary(con, {"trade_date": "2026-11-27", "lost": 0, "report_path": str(deep),
                         "instructions_csv": str(tmp_path / "i.csv"), "logs": str(tmp_path)})
    left = _still_running(con, Settings(pg_port=15999, kafka_port=19999, kafka_brokers=1,
                                        state_dir=tmp_path))
    text = out.getvalue()
    # soft wrap: the path is one line of text however narrow the terminal
    assert any(line.endswith(str(deep)) for line in text.splitlines()), text
    assert "…" not in text
    assert left == {"postgres": "127.0.0.1:15999", "kafka": "127.0.0.1:19999"}
    assert "make down" in text and "127.0.0.1:15999" in text
    # External services are not the demo's to stop, and it does not claim them.
    assert _still_running(con, Settings(kafka_bootstrap="kafka:9092")) == {}
