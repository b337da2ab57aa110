"""The figures of an audit report, gathered from the run, the ledgers and the heartbeats."""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from settlement.config import LEDGERS, Settings
from settlement.db import open_connection, q
from settlement.eod.model import Publication, SettlementResult, SourceChoice
from settlement.validation.run import ValidationOutcome

TOP_OBLIGATIONS = 10
# Busts and corrections listed by name: the largest cash effects first (all are counted).
LISTED_AMENDMENTS = 500
FAILOVER_GAP = dt.timedelta(seconds=3)  # heartbeats are 1 s apart; 3 missed = a dead site
# The open ends of an ingestion window, as bounds PostgreSQL's timestamptz can hold.
OPEN_START = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
OPEN_END = dt.datetime(9999, 12, 30, tzinfo=dt.UTC)


def ledger_facts(settings: Settings, trade_date: str) -> dict[str, Any]:
    """What each ledger recorded about ``trade_date`` and only it: dead letters by the day's
    offsets, batches and heartbeats within the day's ingestion window (sql/queries/report.sql
    says how both are bounded), aggregated by PostgreSQL."""
    out: dict[str, Any] = {}
    day = {"topic": settings.topic, "trade_date": trade_date,
           "partitions": settings.partitions}
    for name in LEDGERS:
        try:
            with open_connection(settings.ledger_dsn(name)) as conn:
                facts = day_facts(conn, day)
        except psycopg.Error:
            continue
        if facts is not None:
            out[name] = facts
    return out


def day_facts(conn: psycopg.Connection, day: dict[str, Any]) -> dict[str, Any] | None:
    """One ledger's figures of one day; None when the ledger saw nothing of it."""
    start, end = conn.execute(q("report", "ingest_window"), day).fetchone()  # type: ignore[misc]
    window = {**day, "start_at": start or OPEN_START, "end_at": end or OPEN_END,
              "gap": FAILOVER_GAP}
    dead = reason_kinds(conn.execute(q("report", "dead_letters_by_reason"), day))
    late = {str(p): int(n) for p, n in conn.execute(q("ledger", "late_trades"), day)}
    loss = [{"partition": p, "from_offset": a, "to_offset": b, "site": site,
             "detected_at": at.isoformat()}
            for p, a, b, site, at in conn.execute(q("ledger", "data_loss_for_day"), day)]
    sites = {s: {"duplicates_suppressed": int(d or 0), "trades_ingested": int(i or 0),
                 "dead_letters": int(x or 0)}
             for s, d, i, x in conn.execute(q("report", "duplicates_by_site"), window)}
    series = ingest_series(conn.execute(q("report", "ingest_batches"), window).fetchall())
    events = heartbeat_events(conn.execute(q("report", "heartbeat_events"), window).fetchall())
    beats = {s: {"heartbeats": int(n), "first": a.isoformat(), "last": b.isoformat()}
             for s, n, a, b in conn.execute(q("report", "heartbeat_stats"), window)}
    if not (sites or dead or beats or late or loss):
        return None
    return {"dead_letters_by_reason": dead, "sites": sites,
            # null: open (no earlier day in this ledger / the day is not closed yet)
            "ingest_window": [start and start.isoformat(), end and end.isoformat()],
            "ingest_series": series,
            "heartbeats": beats,
            "failover_events": events,
            # trades of this day that came after its close marker (dead-lettered)
            "late_trades": late,
            # retention gaps that may have cut this day (validation fails on them)
            "data_loss_events": loss}


def heartbeat_events(rows: list[tuple[str, dt.datetime, list[int], dt.datetime | None,
                                      list[int] | None, bool]]) -> list[dict[str, Any]]:
    """Events from the rows of the heartbeat_events query (only the beats that matter)."""
    events: list[dict[str, Any]] = []
    for site, at, parts, prev_at, prev_parts, is_last in rows:
        if prev_at is not None and at - prev_at > FAILOVER_GAP:
            events.append({"site": site, "at": prev_at.isoformat(), "event": "silent",
                           "detail": f"no heartbeat for {(at - prev_at).total_seconds():.0f}s"})
        if prev_parts is not None and sorted(parts) != sorted(prev_parts):
            events.append({"site": site, "at": at.isoformat(), "event": "partitions",
                           "detail": f"{sorted(prev_parts)} -> {sorted(parts)}"})
        if is_last:
            events.append({"site": site, "at": at.isoformat(), "event": "last heartbeat",
                           "detail": "the site's final beat in this day's window"})
    return sorted(events, key=lambda e: e["at"])


def reason_kinds(rows: Any) -> dict[str, int]:
    """Dead-letter counts by kind of reason: quoted values and numbers are elided, so
    "buyer equals seller ('ACC0177')" and "... ('ACC0121')" count as one kind."""
    kinds: dict[str, int] = defaultdict(int)
    for reason, n in rows:
        kinds[re.sub(r"'[^']*'|(?<![\w-])-?\d+", "…", reason)] += int(n)
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def ingest_series(batches: list[tuple[str, dt.datetime, int]], buckets: int = 60
                  ) -> dict[str, Any]:
    """Trades applied per site in about ``buckets`` equal time slices of the ingest span."""
    if not batches:
        return {"start": None, "seconds_per_bucket": 0, "sites": {}}
    start, end = batches[0][1], batches[-1][1]
    width = max((end - start).total_seconds() / buckets, 1.0)
    n = int((end - start).total_seconds() // width) + 1
    sites: dict[str, list[int]] = {}
    for site, at, inserted in batches:
        row = sites.setdefault(site, [0] * n)
        row[min(int((at - start).total_seconds() // width), n - 1)] += int(inserted or 0)
    return {"start": start.isoformat(), "end": end.isoformat(),
            "seconds_per_bucket": round(width, 3), "sites": sites}


def gather_facts(settings: Settings, run_id: int, trade_date: str, choice: SourceChoice,
                 result: SettlementResult, outcome: ValidationOutcome,
                 publication: Publication,
                 instructions: dict[str, Any] | None = None) -> dict[str, Any]:
    per_partition: dict[int, dict[str, Any]] = defaultdict(dict)
    for p, last in result.close_markers.items():
        per_partition[p]["last_seq"] = last
    for p, (start, end) in choice.kafka_ranges.items():
        per_partition[p]["offsets"] = [start, end]
    for p, n in result.trades_per_partition.items():
        per_partition[p]["trades"] = n
    ledgers = ledger_facts(settings, trade_date)
    top = sorted(result.obligations, key=lambda o: abs(o.net_cash),
                 reverse=True)[:TOP_OBLIGATIONS]
    return {
        "title": f"Settlement audit report {trade_date}",
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "run_id": run_id,
        "trade_date": trade_date,
        "source": choice.source,
        "source_reason": choice.reason,
        "ledgers_read": list(choice.ledgers),
        "trades": result.trades,
        "duplicates_removed_in_settlement": result.duplicates_removed,
        "malformed_in_source": result.malformed,
        "partitions": {str(p): v for p, v in sorted(per_partition.items())},
        "gross_notional": str(result.netting.gross_notional),
        "net_settlement": str(result.netting.net_settlement),
        "netting_efficiency": None if result.netting.efficiency is None
        else str(result.netting.efficiency),
        "accounts": len(result.obligations),
        "positions": len(result.positions),
        "largest_obligations": [
            {"account": o.account, "net_cash": str(o.net_cash), "pays": o.net_cash < 0,
             "buy_amount": str(o.buy_amount), "sell_amount": str(o.sell_amount),
             "trades": o.trade_count}
            for o in top],
        "instruments": [
            {"symbol": i.symbol, "trades": i.trades, "volume": i.volume,
             "notional": str(i.notional),
             "vwap": str(Decimal(i.vwap).quantize(Decimal("0.0001")))}
            for i in result.instruments],
        "validation": outcome.as_dict(),
        "publication": {"published": publication.published, "note": publication.note,
                        "accepted_incomplete": publication.accepted_incomplete},
        "ledgers": ledgers,
        # Each ledger dead-letters the same late messages: the day's count is the largest.
        "late_trades": max((sum(led["late_trades"].values()) for led in ledgers.values()),
                           default=0),
        # Read from Kafka: late trades of earlier days that sat in this day's range.
        "late_trades_in_range": {d: {str(p): n for p, n in sorted(parts.items())}
                                 for d, parts in sorted(result.late_in_range.items())},
        "amendments": amendment_facts(result),
        "settlement": settlement_facts(instructions),
        "timings": result.timings,
    }


def settlement_facts(instructions: dict[str, Any] | None) -> dict[str, Any] | None:
    """The published day's instructions: its settlement date, how many, the files (by name:
    they lie beside the report's folder), the fails carried in from earlier dates. The
    fails carried out are known only once the agent answers: the report page in the UI
    lists them as they are then (settlement.instructions.store.carried_out)."""
    if instructions is None:
        return None
    return {"settlement_date": instructions["settlement_date"],
            "instructions": instructions["instructions"], "version": instructions["version"],
            "files": {fmt: f"../instructions/{Path(path).name}"
                      for fmt, path in instructions["paths"].items()},
            "carried_in": instructions["carried_in"], "carried_out": []}


def amendment_facts(result: SettlementResult) -> dict[str, Any]:
    """The day's busts and corrections: counts, their total cash effect (the change in
    notional they made), and the largest by cash effect with the trade before and after."""
    items = result.amendments
    listed = sorted(items, key=lambda a: (-abs(a.notional_change), a.trade_id, a.seq))
    return {"cancelled": sum(1 for a in items if a.kind == "cancel"),
            "corrections": sum(1 for a in items if a.kind == "correct"),
            "notional_change": str(sum((a.notional_change for a in items), Decimal(0))),
            "listed": [a.as_dict() for a in listed[:LISTED_AMENDMENTS]]}
