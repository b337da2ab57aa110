"""The Python worker's side of the Kafka classifier (``settlement.spark.parse``): what runs in
each Spark task's Python worker, over the task's Arrow batches.

A module of its own so that a worker imports only what classifying needs (pyarrow, the
contract, the sites' parser ``consumers.parse``): a worker unpickles ``classify_arrow`` by
importing its module, and ``settlement.spark.parse`` pulls in the settings (pydantic) and
Spark's SQL functions: 0.47 s of a worker's start against 0.31 s for this module, paid by
every worker of a close (pyarrow imports pandas on its first conversion of a list either
way).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from settlement.contract import AMENDMENTS, CANCEL, CLOSE, CORRECT, TRADE
from settlement.spark.rowhash import row_hashes

# settlement.spark.schemas.PRICE (decimal(18,4)), without importing Spark's SQL types here;
# tests/test_jvm.py holds the two to each other.
PRICE_PRECISION, PRICE_SCALE = 18, 4
# settlement.spark.parse.CLASSIFIED_SCHEMA's field names, in its order (tests hold the two
# to each other).
CLASSIFIED_FIELDS = (
    "kafka_partition", "kafka_offset", "reason", "_kind", "raw", "trade_id", "trade_date",
    "seq", "symbol", "price", "quantity", "buyer", "seller", "executed_at", "_close_date",
    "_last_seq", "_dup", "_version", "_note", "_row_hi", "_row_lo")
# Arrow types of the output, built once per worker (the session time zone is UTC).
_A_DATE = pa.date32()
_A_PRICE = pa.decimal128(PRICE_PRECISION, PRICE_SCALE)
_A_TS = pa.timestamp("us", tz="UTC")
_UNITS = pa.scalar(10_000, pa.decimal128(5, 0))  # a price times this: its 1/10,000ths
_NO_TRADE = (None,) * 9
_TRADE_B, _CLOSE_B = TRADE.encode(), CLOSE.encode()
_CANCEL_B, _CORRECT_B = CANCEL.encode(), CORRECT.encode()


def classify_arrow(batches: Iterator[pa.RecordBatch], max_bytes: int
                   ) -> Iterator[pa.RecordBatch]:
    """The Python worker's side: (kafka_partition, kafka_offset, value, _kind) batches of one
    task in, ``CLASSIFIED_SCHEMA`` batches out. Runs on executors, so it imports the parser
    here (the ``--py-files`` zip carries ``consumers``)."""
    from consumers.parse import (
        REPLAY,
        AmendedTrade,
        Amendment,
        KeptMarker,
        Malformed,
        amended_marker_refusal,
        amendment,
        amendment_conflict_reason,
        amendment_fingerprint,
        amendment_refusal,
        apply_amendment,
        close_marker,
        conflict_reason,
        covered,
        decode,
        fast_trade_values,
        fast_trades,
        fingerprint,
        late_reason,
        marker_conflict_reason,
        trade_values,
    )
    from consumers.runtime import hot_loop

    # Per Kafka partition (a task reads one, but a test's frame may hold several): trade id
    # -> the kept copy packed in one int (offset << 64 | 64-bit fingerprint), since a task
    # holds a partition's day, millions of ids; and trade date -> the kept close marker's
    # (last_seq, offset).
    # An amendment must name its trade's date: per partition, the first trade's date, and
    # the trades of any other date (none on a normal day, so the hot path adds one compare).
    seen_in: dict[int, dict[str, int]] = {}
    first_date: dict[int, str] = {}
    other_dates: dict[int, dict[str, str]] = {}
    closes_in: dict[int, dict[str, tuple[int, int]]] = {}
    # Amendments, as the sites hold them (consumers.parse.amendment_refusal): per partition,
    # trade id -> its state once amended, and each amendment identity -> its kept copy.
    amended_in: dict[int, dict[str, AmendedTrade]] = {}
    amends_in: dict[int, dict[tuple[str, str, int], int]] = {}
    # The amended close (consumers.parse, as the sites keep it): per partition and date, the
    # amended close markers kept; per partition, the amendments held since their day's close
    # (the amendment, its offset, and where its verdict is written), in offset order. A
    # batch holding one is yielded only at the end of the task, when its verdicts are final.
    amended_closes: dict[int, dict[str, list[KeptMarker]]] = {}
    held_in: dict[int, list[tuple[Amendment, int, list[str | None], list[bytes | None],
                                  list[bool], int]]] = {}
    held_batches: list[tuple[object, ...]] = []
    mask = (1 << 64) - 1

    def late(partition: int, trade_date: str) -> str | None:
        """The late reason of a message of ``trade_date`` when its day closed earlier on the
        partition (in this task: the day's range, or a test's frame)."""
        closed = closes_in.get(partition)
        at = closed.get(trade_date) if closed else None
        return None if at is None else late_reason(trade_date, partition, at[1])

    def check_amendment(a: Amendment, p: int, offset: int) -> tuple[str | None, bool]:
        """An amendment's verdict as the sites give it (the reason, or None, and whether it
        is a replay); an accepted one updates its trade's state."""
        ident = (a.trade_id, a.kind, a.version or 0)
        fp = amendment_fingerprint(a) & mask
        held_a = amends_in.setdefault(p, {}).get(ident)
        if held_a is not None:
            if held_a & mask != fp:
                return amendment_conflict_reason(a, p, held_a >> 64), False
            return None, True
        state = amended_in.setdefault(p, {}).get(a.trade_id)
        if state is None and a.trade_id in seen_in.get(p, {}):
            state = AmendedTrade(other_dates.get(p, {}).get(a.trade_id, first_date[p]))
        why = amendment_refusal(a, state)
        if why is not None:
            return why, False
        apply_amendment(a, state)  # type: ignore[arg-type]
        amended_in[p][a.trade_id] = state  # type: ignore[assignment]
        amends_in[p][ident] = offset << 64 | fp
        return None, False

    def decide_held(p: int, trade_date: str, last_seq: int, marker_offset: int) -> None:
        """An amended close marker kept: the held amendments of its day it covers are
        decided, in offset order (the sites' consumers.ledger._decide_held)."""
        rest = []
        for h in held_in.get(p, []):
            a, off, h_reasons, h_raws, h_dups, j = h
            if a.trade_date != trade_date or not covered(a.seq, off, last_seq, marker_offset):
                rest.append(h)
                continue
            why, dup = check_amendment(a, p, off)
            h_reasons[j], h_dups[j] = why, dup
            if why is None:
                h_raws[j] = None
        held_in[p] = rest

    def is_copy(t: tuple[str, str, int, str, str, int, str, str, str], partition: int,
                offset: int, fp: int | None = None) -> bool:
        """Whether a trade (``trade_values``' order) is a later copy of one kept in its
        partition; its first copy is kept. Raises Malformed for a conflicting replay.
        ``fp``: the trade's ``fingerprint`` when the caller has it."""
        trade_id, trade_date = t[0], t[1]
        fp = (fingerprint(t) if fp is None else fp) & mask
        seen = seen_in.get(partition)
        if seen is None:
            seen = seen_in[partition] = {}
        kept = seen.get(trade_id)
        if kept is None:
            seen[trade_id] = offset << 64 | fp
            if trade_date != first_date.setdefault(partition, trade_date):
                other_dates.setdefault(partition, {})[trade_id] = trade_date
            return False
        if kept & mask == fp:
            return True
        raise Malformed(conflict_reason(trade_id, partition, kept >> 64))

    def all_first_copies(plain: list[tuple[str, str, int, str, str, int, str, str, str]],
                         fps: list[int], partitions: list[int], offsets: list[int]) -> bool:
        """Whether a batch of plain trades is what most batches are: one partition, one date
        (its first), no trade of a closed day, and every trade id new; then they are kept,
        in a few set and dict operations instead of ``is_copy`` per trade. False, with
        nothing kept, otherwise (the caller goes trade by trade)."""
        p, n = partitions[0], len(plain)
        if partitions.count(p) != n:
            return False
        dates = {t[1] for t in plain}
        closed = closes_in.get(p)
        if dates != {first_date.get(p, plain[0][1])} or (closed and not closed.keys().isdisjoint(
                dates)):
            return False
        ids = [t[0] for t in plain]
        seen = seen_in.setdefault(p, {})
        if len(set(ids)) != n or not seen.keys().isdisjoint(ids):
            return False
        first_date.setdefault(p, plain[0][1])
        kept = [o << 64 | f & mask for o, f in zip(offsets, fps, strict=True)]
        seen.update(zip(ids, kept, strict=True))
        return True

    with hot_loop():  # a worker classifies millions of messages (consumers.runtime)
        for batch in batches:
            partitions = batch.column(0).to_pylist()
            offsets = batch.column(1).to_pylist()
            values = batch.column(2).to_pylist()
            kind_bytes = batch.column(3).to_pylist()
            n = len(values)
            kinds: list[str] = [TRADE] * n
            reasons: list[str | None] = [None] * n
            raws: list[bytes | None] = [None] * n
            dups: list[bool] = [False] * n
            trades: list[tuple[object, ...]] = [_NO_TRADE] * n
            close_dates: list[str | None] = [None] * n
            last_seqs: list[int | None] = [None] * n
            versions: list[int | None] = [None] * n
            notes: list[str | None] = [None] * n
            # A batch of plain trades only (most of a day): checked whole, as a site checks
            # a poll (consumers.parse.fast_trades, each value's verdict that of fast_trade);
            # what is left per message is keeping each trade's first copy.
            plain = fast_trades(values, max_bytes) if kind_bytes.count(_TRADE_B) == n else None
            holds = False  # the batch holds an amendment an amended close may yet decide
            for i in range(n if plain is None else 0):
                kb = kind_bytes[i]
                kind = (TRADE if kb == _TRADE_B else CLOSE if kb == _CLOSE_B else CANCEL
                        if kb == _CANCEL_B else CORRECT if kb == _CORRECT_B
                        else kb.decode("utf-8", "replace"))
                kinds[i] = kind
                try:
                    t = fast_trade_values(values[i], max_bytes) if kind == TRADE else None
                    if t is None:  # not a plain trade: the slow path decides (and says why)
                        obj = decode(values[i], max_bytes)
                    if kind == TRADE:
                        t = t or trade_values(obj)
                        why_late = late(partitions[i], t[1])  # type: ignore[arg-type]
                        if why_late is not None:
                            raise Malformed(why_late)
                        dups[i] = is_copy(t, partitions[i], offsets[i])
                        trades[i] = t
                    elif kind == CLOSE:
                        p = partitions[i]
                        cm = close_marker(obj, p)
                        if cm.amended:
                            kept = amended_closes.setdefault(p, {}).setdefault(cm.trade_date, [])
                            why = amended_marker_refusal(
                                cm, offsets[i], closes_in.get(p, {}).get(cm.trade_date), kept)
                            if why is None:
                                kept.append(KeptMarker(cm.amended, cm.last_seq, offsets[i]))
                                decide_held(p, cm.trade_date, cm.last_seq, offsets[i])
                            elif why != REPLAY:
                                raise Malformed(why)
                        else:
                            held = closes_in.setdefault(p, {}).setdefault(
                                cm.trade_date, (cm.last_seq, offsets[i]))
                            if held[0] != cm.last_seq:
                                raise Malformed(marker_conflict_reason(
                                    cm.trade_date, cm.partition, cm.last_seq, held[0],
                                    held[1]))
                        close_dates[i], last_seqs[i] = cm.trade_date, cm.last_seq
                    elif kind in AMENDMENTS:
                        a = amendment(obj, kind)
                        p = partitions[i]
                        trades[i] = (a.values if a.values is not None
                                     else (a.trade_id, a.trade_date, a.seq, *_NO_TRADE[3:]))
                        versions[i], notes[i] = a.version, a.reason
                        why_late = late(p, a.trade_date)
                        if why_late is not None:
                            # Held: a late dead letter unless an amended close marker
                            # behind it covers it (decide_held).
                            reasons[i], raws[i] = why_late, values[i]
                            held_in.setdefault(p, []).append(
                                (a, offsets[i], reasons, raws, dups, i))
                            holds = True
                            continue
                        why, dups[i] = check_amendment(a, p, offsets[i])
                        if why is not None:
                            raise Malformed(why)
                    else:
                        raise Malformed(f"unknown message type {kind!r}")
                except Malformed as e:
                    reasons[i], raws[i] = str(e), values[i]
            fps = fingerprints(plain) if plain else []
            if plain and all_first_copies(plain, fps, partitions, offsets):
                trades = plain  # type: ignore[assignment]
                plain = None
            for i, t in enumerate(plain or ()):
                try:
                    if closes_in and (why_late := late(partitions[i], t[1])) is not None:
                        raise Malformed(why_late)
                    dups[i] = is_copy(t, partitions[i], offsets[i], fps[i])
                except Malformed as e:
                    reasons[i], raws[i] = str(e), values[i]
                    continue
                trades[i] = t
            out = (batch, kinds, reasons, raws, trades, close_dates, last_seqs,
                   dups, versions, notes)
            if holds:
                held_batches.append(out)
            else:
                yield _output(*out)  # type: ignore[arg-type]
        for out in held_batches:  # every verdict is final once the task's input is read
            yield _output(*out)  # type: ignore[arg-type]


def fingerprints(trades: list[tuple[str, str, int, str, str, int, str, str, str]]
                 ) -> list[int]:
    """``consumers.parse.fingerprint`` of each plain trade, equal to it (the same hash of the
    same tuple), with its two normalisations made by Arrow over the batch: the price without
    trailing zeros after its point, the execution time's UTC text without them (an
    execution time not in UTC, rare, is converted by ``utc_instant`` itself)."""
    from consumers.parse import utc_instant

    _, tdate, seq, sym, price, qty, buyer, seller, at = zip(*trades, strict=True)
    at_text = pa.array(at, pa.string())
    if pc.all(pc.ends_with(at_text, "Z")).as_py():
        instants = _no_trailing_zeros(pc.utf8_slice_codeunits(at_text, 0, -1)).to_pylist()
    else:
        instants = list(map(utc_instant, at))
    prices = _no_trailing_zeros(pa.array(price, pa.string())).to_pylist()
    return list(map(hash, zip(tdate, seq, sym, prices, qty, buyer, seller, instants,
                              strict=True)))


def _no_trailing_zeros(text: pa.Array) -> pa.Array:
    """Each text as ``t.rstrip("0").rstrip(".") if "." in t else t``."""
    trimmed = pc.utf8_rtrim(pc.utf8_rtrim(text, characters="0"), characters=".")
    return pc.if_else(pc.match_substring(text, "."), trimmed, text)


def _output(batch: pa.RecordBatch, kinds: list[str],
            reasons: list[str | None], raws: list[bytes | None],
            trades: list[tuple[object, ...]], close_dates: list[str | None],
            last_seqs: list[int | None], dups: list[bool], versions: list[int | None],
            notes: list[str | None]) -> pa.RecordBatch:
    """The verdicts as typed Arrow columns; the casts from the wire text are Arrow's (C),
    exact, and cannot fail on text the contract accepted. The row hashes are taken of the
    typed values (days, 1/10,000ths of the price, microseconds), as Spark's ``row_hash``
    takes them of the typed columns."""
    tid, tdate, seq, sym, price, qty, buyer, seller, at = (
        zip(*trades, strict=True) if trades else ((),) * 9)
    text = pa.string()
    dates = pa.array(tdate, text).cast(_A_DATE)
    prices = pa.array(price, text).cast(_A_PRICE)
    times = pa.array(at, text).cast(_A_TS)
    ids, seqs, syms = pa.array(tid, text), pa.array(seq, pa.int64()), pa.array(sym, text)
    qtys, buyers, sellers = (pa.array(qty, pa.int64()), pa.array(buyer, text),
                             pa.array(seller, text))
    # A price times 10,000 is integral: the safe cast to int64 is exact or raises.
    row_hi, row_lo = row_hashes(
        ids, dates.cast(pa.int32()), seqs, batch.column(0), syms,
        pc.multiply(prices, _UNITS).cast(pa.int64()), qtys, buyers, sellers,
        times.cast(pa.int64()))
    return pa.RecordBatch.from_arrays([
        batch.column(0),
        batch.column(1),
        pa.array(reasons, text),
        pa.array(kinds, text),
        pa.array(raws, pa.binary()),
        ids,
        dates,
        seqs,
        syms,
        prices,
        qtys,
        buyers,
        sellers,
        times,
        pa.array(close_dates, text).cast(_A_DATE),
        pa.array(last_seqs, pa.int64()),
        pa.array(dups, pa.bool_()),
        pa.array(versions, pa.int32()),
        pa.array(notes, text),
        row_hi,
        row_lo,
    ], names=list(CLASSIFIED_FIELDS))
