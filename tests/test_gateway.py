"""The simulated trading day: Kafka-compatible partitioning and a realistic, exact shape."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

import pytest

from settlement.simulator.gateway import DayGenerator, SimulationSpec, murmur2, partition_for


@pytest.mark.parametrize(
    ("key", "expected"),
    # Vectors from Apache Kafka's UtilsTest: the Java client must put a symbol's trades on
    # the same partition as we do.
    [("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
     ("a-little-bit-longer-string", -1486304829),
     ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), ("abc", 479470107)],
)
def test_murmur2_matches_kafka(key: str, expected: int) -> None:
    assert murmur2(key.encode()) == expected


def _day(seed: int = 1, n: int = 5000) -> tuple[list, DayGenerator]:
    gen = DayGenerator(SimulationSpec("2026-11-23", n, seed), 6)
    return list(gen.trades()), gen


def test_day_is_deterministic_from_the_seed() -> None:
    a, _ = _day(7)
    b, _ = _day(7)
    c, _ = _day(8)
    assert [t.value() for t in a] == [t.value() for t in b]
    assert [t.value() for t in a] != [t.value() for t in c]


def test_day_shape() -> None:
    trades, gen = _day(3, 20000)
    assert len({t.trade_id for t in trades}) == len(trades)
    seqs: dict[int, list[int]] = defaultdict(list)
    for t in trades:
        seqs[t.partition].append(t.seq)
        assert t.partition == partition_for(t.symbol.encode(), 6)
        assert t.buyer != t.seller and t.quantity > 0 and t.price > 0
        assert t.price == t.price.quantize(Decimal("0.0001"))
    for p, s in seqs.items():
        assert s == list(range(1, len(s) + 1)), f"partition {p} not contiguous"
        assert gen.last_seq[p] == len(s)
    volume = Counter(t.symbol for t in trades)
    assert 30 <= len(volume) <= 40
    top = volume.most_common(1)[0][1]
    assert top > 8 * min(volume.values())  # skewed, like a real market
    assert len({t.buyer for t in trades} | {t.seller for t in trades}) > 250
    times = [t.executed_at for t in trades]
    assert times == sorted(times)
    assert times[0].startswith("2026-11-23T13:") and times[-1].startswith("2026-11-23T19:")


def test_trade_value_is_the_contract_json() -> None:
    trades, _ = _day(1, 1)
    obj = json.loads(trades[0].value())
    assert set(obj) == {"trade_id", "trade_date", "seq", "symbol", "price", "quantity",
                        "buyer", "seller", "executed_at"}
    assert isinstance(obj["price"], str) and Decimal(obj["price"]) > 0


class _Txn:
    """Records the transactional calls made on it; its commit fails as told (the Kafka
    behaviour itself is the drills' and the ingest tests'; this is the retry policy)."""

    def __init__(self, failures: list[Any]) -> None:
        self.failures = failures
        self.abort_failures: list[Any] = []  # the abort fails as told, too
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, _timeout: float) -> None:
        self.calls.append("commit")
        if self.failures:
            raise self.failures.pop(0)

    def abort_transaction(self, _timeout: float) -> None:
        self.calls.append("abort")
        if self.abort_failures:
            raise self.abort_failures.pop(0)

    def flush(self, _timeout: float) -> int:
        return 0


def _kafka_error(**kind: bool) -> Exception:
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "lost", **kind))


def test_a_transaction_the_cluster_lost_is_aborted_and_sent_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from settlement.simulator import gateway

    monkeypatch.setattr(gateway.time, "sleep", lambda _s: None)
    tx = _Txn([_kafka_error(txn_requires_abort=True)])
    errors = ["from before"]
    sent: list[int] = []

    def fill() -> None:
        sent.append(len(sent))
        errors.append("a message of the lost attempt timed out")

    gateway._transaction(tx, fill, errors)
    assert tx.calls == ["begin", "commit", "abort", "begin", "commit"]
    assert sent == [0, 1]
    # The lost attempt's delivery errors are void (its messages were aborted); the kept
    # attempt's stand.
    assert errors == ["from before", "a message of the lost attempt timed out"]
    # A commit that timed out is committed again, not sent again.
    tx = _Txn([_kafka_error(retriable=True)])
    gateway._transaction(tx, lambda: None, [])
    assert tx.calls == ["begin", "commit", "commit"]
    # A fatal error, or the last attempt's, is raised.
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException):
        gateway._transaction(_Txn([_kafka_error(fatal=True)]), lambda: None, [])
    lost = [_kafka_error(txn_requires_abort=True) for _ in range(gateway.TXN_ATTEMPTS)]
    with pytest.raises(KafkaException):
        gateway._transaction(_Txn(lost), lambda: None, [])


def test_a_producer_past_a_fatal_error_is_renewed_and_the_transaction_sent_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI of ef7b560: the abort of a lost transaction timed out, was retried, and the broker
    answered INVALID_TXN_STATE, fatal: that producer accepts nothing more. The gateway makes
    a new one with the same transactional id (its init fences the dead one) and sends the
    transaction again with it."""
    from settlement.simulator import gateway

    monkeypatch.setattr(gateway.time, "sleep", lambda _s: None)
    made: list[_Txn] = []

    def make() -> _Txn:
        first = not made
        tx = _Txn([_kafka_error(txn_requires_abort=True)] if first else [])
        tx.abort_failures = [_kafka_error(fatal=True)] if first else []
        tx.init_transactions = lambda _t, tx=tx: tx.calls.append("init")  # type: ignore[attr-defined]
        made.append(tx)
        return tx

    tx = gateway.Renewable(make)
    sent: list[int] = []
    gateway._transaction(tx, lambda: sent.append(1), [])
    assert [t.calls for t in made] == [["init", "begin", "commit", "abort"],
                                       ["init", "begin", "commit"]]
    assert (sent, tx.renewals) == ([1, 1], 1)
    # A fatal commit renews the producer without an abort (the dead one takes no call).
    made.clear()

    def fatal_commit() -> _Txn:
        t = _Txn([_kafka_error(fatal=True)] if not made else [])
        t.init_transactions = lambda _t, t=t: t.calls.append("init")  # type: ignore[attr-defined]
        made.append(t)
        return t

    tx = gateway.Renewable(fatal_commit)
    gateway._transaction(tx, lambda: None, [])
    assert [t.calls for t in made] == [["init", "begin", "commit"],
                                       ["init", "begin", "commit"]]
