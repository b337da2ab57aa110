"""End of day for one trade date: choose the source, settle, write, validate, report.

One library function used by ``settle eod``, the spark-submit entry point and the Airflow
DAG. Every run is recorded in ``settlement_runs``; results replace the date's rows in one
transaction, so running a date twice gives the same tables.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from settlement.config import Settings
from settlement.db import connect, q
from settlement.sources import SourceChoice, choose_source

RESULT_TABLES: dict[str, Sequence[str]] = {
    "positions": ("trade_date", "account", "symbol", "bought_qty", "sold_qty", "net_qty",
                  "buy_amount", "sell_amount", "net_cash", "trade_count"),
    "cash_obligations": ("trade_date", "account", "buy_amount", "sell_amount", "net_cash",
                         "trade_count"),
    "instrument_summary": ("trade_date", "symbol", "trades", "volume", "notional", "vwap",
                           "low_price", "high_price"),
}


def start_run(settings: Settings, trade_date: str, choice: SourceChoice) -> int:
    with connect(settings.settlement_dsn) as conn:
        row = conn.execute(q("eod", "start_run"), {
            "trade_date": trade_date, "source": choice.source, "source_reason": choice.reason,
            "offsets": json.dumps(choice.as_dict()),
        }).fetchone()
        conn.commit()
    assert row is not None
    return int(row[0])


def finish_run(settings: Settings, run_id: int, status: str, summary: dict[str, Any],
               error: str | None = None) -> None:
    with connect(settings.settlement_dsn) as conn:
        conn.execute(q("eod", "finish_run"), {
            "run_id": run_id, "status": status, "error": error,
            "trades": summary.get("trades"),
            "duplicates_removed": summary.get("duplicates_removed"),
            "malformed": summary.get("malformed"), "positions": summary.get("positions"),
            "accounts": summary.get("accounts"),
            "gross_notional": summary.get("gross_notional"),
            "netting_efficiency": summary.get("netting_efficiency"),
            "timings": json.dumps(summary.get("timings", {})),
        })
        conn.commit()


def write_results(settings: Settings, trade_date: str, tables: dict[str, list[tuple[Any, ...]]]
                  ) -> None:
    """Replace the date's rows in every result table, atomically."""
    with connect(settings.settlement_dsn) as conn, conn.transaction():
        for table, columns in RESULT_TABLES.items():
            conn.execute(q("eod", f"delete_{table}"), {"trade_date": trade_date})
            with conn.cursor().copy(
                f"copy {table} ({', '.join(columns)}) from stdin"  # type: ignore[arg-type]
            ) as copy:
                for row in tables[table]:
                    copy.write_row(row)


def run_eod(settings: Settings, trade_date: str, source: str = "auto",
            validate: bool = True, reason: str | None = None) -> dict[str, Any]:
    """Settle one date. ``reason``: when a caller (the DAG's branch) already chose the source,
    its reason is what the run records."""
    from settlement.spark.job import settle
    from settlement.spark.session import build_session

    t0 = time.perf_counter()
    choice = choose_source(settings, trade_date, source)
    if reason:
        choice = dataclasses.replace(choice, reason=reason)
    run_id = start_run(settings, trade_date, choice)
    summary: dict[str, Any] = {"run_id": run_id, **choice.as_dict()}
    result = None
    try:
        spark = build_session(settings, app_name=f"settlement-{trade_date}")
        result = settle(spark, settings, trade_date, choice)
        t1 = time.perf_counter()
        write_results(settings, trade_date, {
            "positions": result.positions, "cash_obligations": result.obligations,
            "instrument_summary": result.instruments,
        })
        result.timings["write_seconds"] = round(time.perf_counter() - t1, 3)
        result.timings["total_seconds"] = round(time.perf_counter() - t0, 3)
        summary.update(result.summary())
        finish_run(settings, run_id, "succeeded", summary)
        summary["status"] = "succeeded"
        if validate:
            summary.update(_validate(settings, run_id, trade_date, choice, result))
    except Exception as e:
        finish_run(settings, run_id, "failed", summary, error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if result is not None and result.trades_df is not None:
            result.trades_df.unpersist()
    return summary


def _validate(settings: Settings, run_id: int, trade_date: str, choice: SourceChoice,
              result: Any) -> dict[str, Any]:
    """Great Expectations checks and the audit report, once those modules exist."""
    try:
        from settlement.validation import validate_run
    except ImportError:
        return {"validation_success": None,
                "validation": "not available yet (Great Expectations is a later issue)"}
    return validate_run(settings, run_id, trade_date, choice, result)
