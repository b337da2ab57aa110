"""Exchange gateway simulator: publishes one trading day to the ``trades`` topic.

Deterministic from the seed. Trades go through an idempotent, transactional producer
(acks=all); the exchange sequence number is contiguous per (trade date, partition) and each
partition ends with a market-close marker carrying its last sequence number, so loss is
detectable from Kafka alone. Faults an upstream can produce are injectable: replays through a
second, non-idempotent producer, malformed messages, and aborted transactions.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from settlement.config import Settings
from settlement.contract import (
    CANCEL,
    CANCEL_HEADERS,
    CLOSE_HEADERS,
    CORRECT,
    CORRECT_HEADERS,
    TRADE_HEADERS,
    TRADE_ID,
    TRANSACTIONAL_ID,
)
from settlement.kafka.admin import topic_partitions
from settlement.simulator.hostile import (
    CONTROL_ACCOUNT,
    HOSTILE_ACCOUNTS,
    HOSTILE_SYMBOLS,
    HOSTILE_TRADE_ID_SUFFIX,
)

SESSION_OPEN = dt.time(13, 30)  # 09:30 New York, in UTC
SESSION_SECONDS = 6.5 * 3600
MALFORMED_KINDS = (
    "invalid_json",
    "invalid_utf8",
    "missing_field",
    "wrong_type",
    "negative_quantity",
    "buyer_equals_seller",
    "unknown_date",
    "oversized",
    "control_char",
    "overlong_id",
    "bigint_overflow",
    "duplicate_key",
    "trailing_bytes",
)
TICKERS = (
    "AAPL MSFT NVDA AMZN GOOG META TSLA BRK JPM V UNH XOM JNJ WMT MA PG HD CVX MRK ABBV "
    "KO PEP AVGO COST ADBE CRM BAC MCD TMO CSCO ACN ABT LIN DHR WFC NKE TXN PM ORCL AMD"
).split()




def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner), as a signed 32-bit int."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 * 4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 * 4 + 1] << 8
    if rest >= 1:
        h ^= data[n4 * 4]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class Trade:
    trade_id: str
    trade_date: str
    seq: int
    partition: int
    symbol: str
    price: Decimal
    quantity: int
    buyer: str
    seller: str
    executed_at: str

    def value(self) -> bytes:
        # Hand-built JSON: every field is plain ASCII, and this loop runs millions of times.
        return (
            f'{{"trade_id":"{self.trade_id}","trade_date":"{self.trade_date}",'
            f'"seq":{self.seq},"symbol":"{self.symbol}","price":"{self.price}",'
            f'"quantity":{self.quantity},"buyer":"{self.buyer}","seller":"{self.seller}",'
            f'"executed_at":"{self.executed_at}"}}'
        ).encode()


class JsonTrade(Trade):
    """A trade whose text fields may hold anything printable (hostile names): encoded by a
    JSON encoder, never by string formatting."""

    def value(self) -> bytes:
        return json.dumps({
            "trade_id": self.trade_id, "trade_date": self.trade_date, "seq": self.seq,
            "symbol": self.symbol, "price": str(self.price), "quantity": self.quantity,
            "buyer": self.buyer, "seller": self.seller, "executed_at": self.executed_at,
        }, ensure_ascii=False).encode()


@dataclass(frozen=True)
class Amend:
    """A cancel or a correction of ``trade``, sent after it on its partition with the
    partition's next ``seq`` (the contract's amendments, settlement.contract)."""

    kind: str  # CANCEL | CORRECT
    trade: Trade
    seq: int
    version: int = 0  # corrections: 2, 3, ...
    price: Decimal | None = None  # corrections: the new values (symbol and accounts stay)
    quantity: int | None = None

    @property
    def partition(self) -> int:
        return self.trade.partition

    @property
    def symbol(self) -> str:
        return self.trade.symbol

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return CANCEL_HEADERS if self.kind == CANCEL else CORRECT_HEADERS

    def corrected(self) -> Trade:
        """The trade as this correction states it (its own seq on the wire)."""
        t = self.trade
        return type(t)(t.trade_id, t.trade_date, self.seq, t.partition, t.symbol,
                       self.price or t.price, self.quantity or t.quantity, t.buyer, t.seller,
                       t.executed_at)

    def value(self) -> bytes:
        if self.kind == CANCEL:
            return json.dumps({"trade_id": self.trade.trade_id,
                               "trade_date": self.trade.trade_date, "seq": self.seq,
                               "reason": "trade break: erroneous execution"},
                              ensure_ascii=False).encode()
        body = json.loads(self.corrected().value())
        return json.dumps({**body, "version": self.version}, ensure_ascii=False).encode()


def final_trades(events: Iterator[Trade | Amend]) -> list[Trade]:
    """The day's trades in their final states: each with its highest correction applied,
    cancelled ones left out; what a clearing house settles (an independent reference for
    the tests; the pipeline's own is settlement.spark.transforms.with_final_states)."""
    final: dict[str, Trade] = {}
    for e in events:
        if isinstance(e, Amend):
            if e.kind == CANCEL:
                final.pop(e.trade.trade_id, None)
            elif e.trade.trade_id in final:
                c = e.corrected()
                final[c.trade_id] = type(c)(c.trade_id, c.trade_date, e.trade.seq,
                                            c.partition, c.symbol, c.price, c.quantity, c.buyer,
                                            c.seller, c.executed_at)
        else:
            final[e.trade_id] = e
    return list(final.values())


@dataclass(frozen=True)
class SimulationSpec:
    trade_date: str
    trades: int
    seed: int = 1
    dup_rate: float = 0.0
    bad_rate: float = 0.0
    abort_rate: float = 0.0
    txn_size: int = 2_000
    accounts: int = 300
    symbols: int = 40
    rate: float | None = None  # trades/s pacing for drills; None = as fast as possible
    # Security drills: some accounts, symbols and trade ids from simulator.hostile.
    hostile_names: bool = False
    # Busts and corrections: the share of trades later cancelled, and later corrected (a
    # quarter of the corrected ones twice, so the highest version has to win).
    cancel_rate: float = 0.0
    correct_rate: float = 0.0


@dataclass
class DayGenerator:
    """The day's trades, deterministic from (seed, date), in execution order."""

    spec: SimulationSpec
    partitions: int
    last_seq: dict[int, int] = field(default_factory=dict)

    def trades(self) -> Iterator[Trade]:
        """The day's trades as sent (amendments left out)."""
        return (e for e in self.events() if not isinstance(e, Amend))

    def events(self) -> Iterator[Trade | Amend]:
        """The day's messages in order: trades and, when the spec asks for them, their
        cancels and corrections a few trades later on the same partition. Amendments draw from
        their own random stream: the trades are the same whatever the rates (only the seqs
        the amendments take move them)."""
        import heapq

        spec = self.spec
        amend_rng = random.Random(f"amend:{spec.seed}:{spec.trade_date}")
        due: list[tuple[int, int, str, Trade, int]] = []  # (at trade, order, kind, trade, version)
        order = 0

        def amend_due(upto: int) -> Iterator[Amend]:
            while due and due[0][0] <= upto:
                _, _, kind, t, version = heapq.heappop(due)
                seqs[t.partition] += 1
                if kind == CANCEL:
                    yield Amend(CANCEL, t, seqs[t.partition])
                else:
                    factor = Decimal(amend_rng.choice(("0.99", "1.01", "0.995", "1.005")))
                    yield Amend(CORRECT, t, seqs[t.partition], version,
                                price=(t.price * factor).quantize(Decimal("0.0001")),
                                quantity=t.quantity + amend_rng.randint(1, 50) * version)

        seqs: dict[int, int] = {}
        trades = self._trades(seqs)
        for i in itertools.count():
            # The amendments due go first, so that seqs rise along the partition's log.
            yield from amend_due(i)
            t = next(trades, None)
            if t is None:
                break
            yield t
            if spec.correct_rate and amend_rng.random() < spec.correct_rate:
                at = i + amend_rng.randint(1, 64)
                heapq.heappush(due, (at, order := order + 1, CORRECT, t, 2))
                if amend_rng.random() < 0.25:
                    heapq.heappush(due, (at + amend_rng.randint(1, 64), order := order + 1,
                                         CORRECT, t, 3))
            if spec.cancel_rate and amend_rng.random() < spec.cancel_rate:
                # After any correction of the trade: a correction of a cancelled trade is a
                # dead letter, not part of a good day.
                at = i + 200 + amend_rng.randint(1, 64)
                heapq.heappush(due, (at, order := order + 1, CANCEL, t, 0))
        yield from amend_due(2**62)
        self.last_seq = seqs

    def _trades(self, seqs: dict[int, int]) -> Iterator[Trade]:
        spec = self.spec
        rng = random.Random(f"trades:{spec.seed}:{spec.trade_date}")
        syms, accounts = day_names(spec)
        make: type[Trade] = JsonTrade if spec.hostile_names else Trade
        # Skewed volume: a few names trade most of the day (Zipf-like weights).
        weights = [1.0 / (rank + 1) ** 1.1 for rank in range(len(syms))]
        cum = _cumulative(weights)
        price = {s: Decimal(rng.randint(500, 50_000)) / 100 for s in syms}
        part = {s: partition_for(s.encode(), self.partitions) for s in syms}
        day = dt.date.fromisoformat(spec.trade_date)
        start = dt.datetime.combine(day, SESSION_OPEN, tzinfo=dt.UTC)
        step = SESSION_SECONDS / max(spec.trades, 1)
        ymd = day.strftime("%Y%m%d")
        seqs.update(dict.fromkeys(range(self.partitions), 0))
        q4 = Decimal("0.0001")
        for i in range(spec.trades):
            sym = syms[_pick(cum, rng.random())]
            # A bounded random walk keeps prices positive and realistic.
            p = price[sym] * Decimal(1 + rng.gauss(0, 0.0005)).quantize(Decimal("0.000001"))
            p = max(p, Decimal("0.01")).quantize(q4)
            price[sym] = p
            # Odd lots, round lots and blocks.
            qty = rng.choice((rng.randint(1, 99), rng.randint(1, 10) * 100,
                              rng.randint(1, 5) * 500))
            buyer, seller = rng.sample(accounts, 2)
            if spec.hostile_names and rng.random() < 0.5:
                # Hostile accounts buy half the day, so they lead the report's obligations.
                buyer = accounts[rng.randrange(len(HOSTILE_ACCOUNTS))]
                seller = accounts[-1] if seller == buyer else seller
            pnum = part[sym]
            seqs[pnum] += 1
            ts = start + dt.timedelta(seconds=i * step + rng.random() * step)
            suffix = HOSTILE_TRADE_ID_SUFFIX if spec.hostile_names and i % 7 == 0 else ""
            yield make(
                trade_id=f"T{ymd}-{i + 1:09d}{suffix}",
                trade_date=spec.trade_date,
                seq=seqs[pnum],
                partition=pnum,
                symbol=sym,
                price=p,
                quantity=qty,
                buyer=buyer,
                seller=seller,
                executed_at=ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            )


def day_names(spec: SimulationSpec) -> tuple[list[str], list[str]]:
    """The symbols and the accounts a day of ``spec`` trades (the reference data the
    simulator's days need: `settle refdata example`)."""
    syms = [TICKERS[i % len(TICKERS)] + ("" if i < len(TICKERS) else str(i // len(TICKERS)))
            for i in range(spec.symbols)]
    accounts = [f"ACC{n:04d}" for n in range(1, spec.accounts + 1)]
    if spec.hostile_names:
        syms, accounts = with_hostile_names(syms, accounts)
    return syms, accounts


def with_hostile_names(symbols: list[str], accounts: list[str]) -> tuple[list[str], list[str]]:
    """The day's symbols and accounts with the hostile ones in front: the most traded symbols
    and accounts that trade all day."""
    syms = [*HOSTILE_SYMBOLS, *symbols[len(HOSTILE_SYMBOLS):]]
    accts = [*HOSTILE_ACCOUNTS, *accounts[len(HOSTILE_ACCOUNTS):]]
    return syms, accts


def control_message(trade: Trade) -> bytes:
    """The hostile drill's refused message: a copy of ``trade`` under another id whose buyer
    holds a control character. Sent besides the trade (it takes no sequence number), so the
    day stays complete and the message is a dead letter."""
    good = json.loads(trade.value())
    good["trade_id"] = trade.trade_id.removesuffix(HOSTILE_TRADE_ID_SUFFIX) + "-CTL"
    good["buyer"] = CONTROL_ACCOUNT
    return json.dumps(good, ensure_ascii=False).encode()


def _cumulative(weights: list[float]) -> list[float]:
    total, acc, out = sum(weights), 0.0, []
    for w in weights:
        acc += w / total
        out.append(acc)
    out[-1] = 1.0
    return out


def _pick(cum: list[float], u: float) -> int:
    import bisect

    return min(bisect.bisect_left(cum, u), len(cum) - 1)


def malformed_message(kind: str, trade: Trade, rng: random.Random) -> bytes:
    """A message an upstream bug could send; each kind fails a different check."""
    good = json.loads(trade.value())
    good["trade_id"] = f"BAD-{trade.trade_id}-{kind}"
    if kind == "invalid_json":
        return trade.value()[: rng.randint(5, 40)]
    if kind == "invalid_utf8":
        return b'{"trade_id": "\xff\xfe\xfa", "x": "\xc3\x28"}'
    if kind == "missing_field":
        del good[rng.choice(["price", "quantity", "buyer", "symbol", "seq"])]
    elif kind == "wrong_type":
        good["quantity"] = "many"
    elif kind == "negative_quantity":
        good["quantity"] = -abs(trade.quantity)
    elif kind == "buyer_equals_seller":
        good["seller"] = good["buyer"]
    elif kind == "unknown_date":
        good["trade_date"] = "2026-02-30"
    elif kind == "oversized":
        good["padding"] = "x" * 70_000
    elif kind == "control_char":  # would break the sites' COPY line; PostgreSQL refuses NUL
        good["symbol"] = good["symbol"][:1] + rng.choice("\n\t\x00\x85") + good["symbol"][1:]
    elif kind == "overlong_id":
        good["trade_id"] = good["trade_id"].ljust(TRADE_ID.max_length + 1, "X")
    elif kind == "bigint_overflow":
        good["seq"] = 2**63
    elif kind == "duplicate_key":  # which of the two would a reader take?
        return json.dumps(good).encode()[:-1] + f', "quantity": {trade.quantity + 1}}}'.encode()
    elif kind == "trailing_bytes":  # a reader that stops after the object would miss it
        return json.dumps(good).encode() + b' {"seq": 1}'
    return json.dumps(good).encode()


def producer_config(settings: Settings, transactional_id: str | None) -> dict[str, Any]:
    conf: dict[str, Any] = {
        **settings.kafka_client_config(),
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "lz4",
        "message.max.bytes": 1_000_000,
        "queue.buffering.max.messages": 500_000,
        # A partition leader at a site that went silent: the brokers elect another once its
        # session expires (about 10 s); asking for metadata every 5 s finds it sooner than
        # librdkafka's 5-minute default, as the sites' consumers do (consumers/site.py).
        "topic.metadata.refresh.interval.ms": 5000,
    }
    if transactional_id:
        # Idempotence: producer id + per-partition sequence numbers, so the broker drops
        # retried duplicates; transactions make a batch of trades atomic across partitions
        # and fence an older gateway instance with the same transactional.id (seed 002).
        conf |= {
            "enable.idempotence": True,
            "transactional.id": transactional_id,
            "max.in.flight.requests.per.connection": 5,
            "retries": 2_147_483_647,
            "transaction.timeout.ms": 60_000,
        }
    else:
        # The "upstream replay" producer: no idempotence, so what it sends twice stays twice.
        conf |= {"enable.idempotence": False}
    return conf


def _produce(producer: Any, topic: str, value: bytes, key: bytes | None, partition: int,
             headers: list[tuple[str, bytes]]) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)  # local queue full: let deliveries drain


# A transaction the cluster lost mid-way (its coordinator or a partition leader cut off,
# messages timed out) is aborted and sent again, as a gateway retrying would; this many
# attempts, a few seconds apart, outlast a coordinator's move to a surviving broker.
TXN_ATTEMPTS = 8


class Renewable:
    """The gateway's transactional producer, replaced by a new instance with the same
    transactional id after a fatal error (a producer that hit one accepts no further
    call). The new one's init_transactions fences the dead one: the coordinator aborts the
    transaction it left open, so its messages are void. Every other call goes to the
    current producer."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self.producer = make()
        self.renewals = 0
        _retrying(lambda: self.producer.init_transactions(30))

    def renew(self) -> None:
        self.producer = self._make()
        self.renewals += 1
        _retrying(lambda: self.producer.init_transactions(30))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)


def _transaction(tx: Any, fill: Callable[[], None], errors: list[str],
                 commit: bool = True) -> None:
    """``fill``'s messages in one transaction, committed (or, ``commit`` False, delivered and
    then aborted: never-committed trades). An abortable error aborts the attempt, forgets its
    delivery errors (an aborted transaction's messages are void) and sends it all again; a
    retriable one retries the commit or abort itself; a fatal one (the abort of a lost
    transaction can end so: the coordinator moved under it) renews the producer (``Renewable``)
    and sends it all again. The last attempt's error is raised, as is a fatal one on a
    producer that cannot be renewed."""
    from confluent_kafka import KafkaException

    for attempt in range(1, TXN_ATTEMPTS + 1):
        mark = len(errors)
        try:
            tx.begin_transaction()
            fill()
            if commit:
                _retrying(lambda: tx.commit_transaction(60))
            else:
                # Delivered first: the aborted trades are then really in the log, and only
                # the abort marker keeps them from read_committed consumers.
                tx.flush(60)
                _retrying(lambda: tx.abort_transaction(60))
            return
        except KafkaException as e:
            err = e.args[0]
            renewable = hasattr(tx, "renew")
            if attempt == TXN_ATTEMPTS or not (err.txn_requires_abort() or err.retriable()
                                               or (err.fatal() and renewable)):
                raise
            print(f"gateway: transaction attempt {attempt} lost ({err.str()}); sending it "
                  "again", file=sys.stderr, flush=True)
            del errors[mark:]
            _abort_or_renew(tx, fatal=err.fatal())
            time.sleep(min(2 * attempt, 10))


def _abort_or_renew(tx: Any, fatal: bool) -> None:
    """Abort a lost transaction; a producer past a fatal error (before or during the abort)
    is renewed instead, when it can be."""
    from confluent_kafka import KafkaException

    if not fatal:
        try:
            _retrying(lambda: tx.abort_transaction(60))
            return
        except KafkaException as e:
            if not (e.args[0].fatal() and hasattr(tx, "renew")):
                raise
    tx.renew()


def _retrying(call: Callable[[], None], attempts: int = 5) -> None:
    """A transactional call retried while its error is retriable (a request timed out)."""
    from confluent_kafka import KafkaException

    for attempt in range(1, attempts + 1):
        try:
            call()
            return
        except KafkaException as e:
            if attempt == attempts or not e.args[0].retriable():
                raise
            time.sleep(1)


def simulate(settings: Settings, spec: SimulationSpec, progress: bool = False,
             transactional_id: str | None = None) -> dict[str, Any]:
    from confluent_kafka import KafkaError, Producer

    t0 = time.monotonic()
    # One transactional id per topic: a restarted gateway of a topic fences its predecessor
    # (seed 002), while gateways of different topics on one cluster (the suite's parallel
    # namespaces, a second market) never fence each other. The ACLs allow the prefix.
    transactional_id = transactional_id or f"{TRANSACTIONAL_ID}-{settings.topic}"
    n_parts = topic_partitions(settings)
    gen = DayGenerator(spec, n_parts)
    rng = random.Random(f"faults:{spec.seed}:{spec.trade_date}")
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        # Aborting a transaction purges its undelivered messages: that is the point of it.
        if err is not None and err.code() != KafkaError._PURGE_QUEUE:
            errors.append(str(err))

    tx = Renewable(lambda: Producer({**producer_config(settings, transactional_id),
                                     "on_delivery": on_delivery}))
    replay = Producer(producer_config(settings, None)) if spec.dup_rate > 0 else None
    topic = settings.topic
    stats: Counter[str] = Counter()
    malformed: Counter[str] = Counter()

    bar = _progress(spec.trades) if progress else None
    try:
        chunk: list[Trade | Amend] = []
        for trade in gen.events():
            chunk.append(trade)
            if len(chunk) >= spec.txn_size:
                _send_chunk(tx, replay, topic, chunk, spec, rng, stats, malformed, errors)
                if bar:
                    bar[0].update(bar[1], advance=len(chunk))
                chunk = []
                _pace(spec, t0, stats["trades"])
        if chunk:
            _send_chunk(tx, replay, topic, chunk, spec, rng, stats, malformed, errors)
            if bar:
                bar[0].update(bar[1], advance=len(chunk))
        if replay is not None:
            # Replays must be in the log before the close markers, like any trade of the day.
            if replay.flush(60) != 0:
                raise RuntimeError("upstream replay producer could not deliver within 60s")
        def markers() -> None:
            for p in range(n_parts):
                marker = {"trade_date": spec.trade_date, "partition": p,
                          "last_seq": gen.last_seq.get(p, 0)}
                _produce(tx, topic, json.dumps(marker).encode(), None, p, CLOSE_HEADERS)

        _transaction(tx, markers, errors)
    finally:
        if bar:
            bar[0].stop()
        tx.flush(30)
    if errors:
        raise RuntimeError(f"{len(errors)} messages failed delivery, first: {errors[0]}")
    seconds = time.monotonic() - t0
    return {
        "trade_date": spec.trade_date,
        "trades": stats["trades"],
        "duplicates_injected": stats["duplicates"],
        "malformed_injected": sum(malformed.values()),
        "malformed_by_kind": dict(sorted(malformed.items())),
        "cancels": stats["cancels"],
        "corrections": stats["corrections"],
        "aborted": stats["aborted_trades"],
        "aborted_transactions": stats["aborted_transactions"],
        "transactions": stats["transactions"] + 1,
        "producer_renewals": tx.renewals,
        "partitions": n_parts,
        "last_seq": {str(p): gen.last_seq.get(p, 0) for p in range(n_parts)},
        "seconds": round(seconds, 3),
        "trades_per_second": round(stats["trades"] / seconds) if seconds else None,
    }


def _send_chunk(tx: Any, replay: Any, topic: str, chunk: list[Trade | Amend],
                spec: SimulationSpec, rng: random.Random, stats: Counter[str],
                malformed: Counter[str], errors: list[str]) -> None:
    if spec.abort_rate and rng.random() < spec.abort_rate:
        # Never-committed trades: read_committed consumers must not see them. The same trades
        # are then re-sent in a committed transaction, as a gateway retrying would. (Purging
        # in-flight messages of an idempotent producer can leave sequence gaps the broker
        # rejects: _transaction delivers them before the abort.)
        def doomed() -> None:
            for t in chunk:
                _produce(tx, topic, t.value(), t.symbol.encode(), t.partition, _headers(t))

        _transaction(tx, doomed, errors, commit=False)
        stats["aborted_trades"] += len(chunk)
        stats["aborted_transactions"] += 1
    # Drawn once, before the first attempt (a transaction sent again is the same messages),
    # in the order the seed has always drawn them: the same seed, the same day.
    bad: list[str | None] = []
    bad_values: list[bytes | None] = []
    for t in chunk:
        kind = None
        if not isinstance(t, Amend) and spec.bad_rate and rng.random() < spec.bad_rate:
            kind = rng.choice(MALFORMED_KINDS)
        bad.append(kind)
        bad_values.append(None if kind is None else malformed_message(kind, t, rng))

    def fill() -> None:
        for t, bad_value in zip(chunk, bad_values, strict=True):
            if isinstance(t, Amend):
                _produce(tx, topic, t.value(), t.symbol.encode(), t.partition, t.headers)
                continue
            if bad_value is not None:
                _produce(tx, topic, bad_value, t.symbol.encode(), t.partition, TRADE_HEADERS)
            if spec.hostile_names and t.trade_id.endswith(HOSTILE_TRADE_ID_SUFFIX):
                _produce(tx, topic, control_message(t), t.symbol.encode(), t.partition,
                         TRADE_HEADERS)
            _produce(tx, topic, t.value(), t.symbol.encode(), t.partition, TRADE_HEADERS)

    _transaction(tx, fill, errors)
    for t, kind in zip(chunk, bad, strict=True):
        if isinstance(t, Amend):
            stats["cancels" if t.kind == CANCEL else "corrections"] += 1
        else:
            if kind is not None:
                malformed[kind] += 1
            if spec.hostile_names and t.trade_id.endswith(HOSTILE_TRADE_ID_SUFFIX):
                malformed["hostile_control_char"] += 1
    stats["transactions"] += 1
    stats["trades"] += sum(1 for t in chunk if not isinstance(t, Amend))
    if replay is not None:
        for t in chunk:
            if rng.random() < spec.dup_rate:
                _produce(replay, topic, t.value(), t.symbol.encode(), t.partition, _headers(t))
                stats["duplicates"] += 1
        replay.poll(0)


def _headers(t: Trade | Amend) -> list[tuple[str, bytes]]:
    return t.headers if isinstance(t, Amend) else TRADE_HEADERS


def _pace(spec: SimulationSpec, t0: float, sent: int) -> None:
    if spec.rate:
        ahead = sent / spec.rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)


def _progress(total: int) -> tuple[Any, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    prog = Progress("[bold]publishing", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    transient=True)
    prog.start()
    return prog, prog.add_task("trades", total=total)
