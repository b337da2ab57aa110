"""Bad data never stops the line, as a property: adversarial messages interleaved with a good
day, published to the real broker, ingested by a real site ``--until-close``.

Hypothesis draws the pools of field values (every field: types, ranges, lengths, unicode and
control characters, dates, timestamps, prices; invalid UTF-8, non-objects, missing and
repeated fields, odd headers) that ``tests/test_parity.py`` uses to hold the two parsers to
one verdict; a seeded builder makes messages from them. Each example gets its own topic and
ledgers, and the ledger gets one extra CHECK that refuses a symbol the contract accepts (as a
stand-in for anything PostgreSQL may refuse), so batches the database refuses are part of
every example. Whatever the messages, the site must reach the day's close markers, and every
message must have exactly one outcome: a trade, a close marker, or a dead letter with a
reason (a replayed trade id or a repeated close marker is the one already stored). No good
trade may be lost.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from psycopg import sql

from consumers.parse import Malformed, close_marker, decode, message_type, trade_copy_line
from settlement import contract as C
from settlement.config import Settings
from settlement.db import connect
from settlement.drills.namespace import (
    drop_namespace,
    namespace_env,
    namespace_settings,
    reset_namespace,
)
from tests.helpers import start_site, wait_exit
from tests.strategies import TYPE_CLOSE, TYPE_TRADE, Builder, Msg, pools

pytestmark = pytest.mark.services
DAY = "2026-11-23"
ADVERSARIAL = 300
GOOD = 120
EXAMPLES = 3


# What a published message is: drawn by the builder, or part of the good day.
ADVERSE, GOOD_TRADE, GOOD_CLOSE = "adversarial", "good trade", "good close marker"


@dataclass(frozen=True)
class Sent:
    """One published message and where it landed."""

    msg: Msg
    role: str
    partition: int
    offset: int


@contextmanager
def namespace(base: Settings) -> Iterator[tuple[Settings, dict[str, str]]]:
    """A topic and ledgers of its own for one example (the ``isolated`` fixture is per test)."""
    import os

    ns = namespace_env(base, f"p{uuid.uuid4().hex[:10]}")
    settings = namespace_settings(base, ns)
    reset_namespace(settings)
    try:
        yield settings, {**os.environ, **ns}
    finally:
        drop_namespace(settings)


def good_trade(n: int, partition: int, seq: int, tag: str) -> Msg:
    value = json.dumps({
        "trade_id": f"GOOD-{tag}-{n:05d}", "trade_date": DAY, "seq": seq,
        "symbol": f"S{partition}", "price": f"{10 + n % 90}.25", "quantity": 1 + n % 500,
        "buyer": f"ACC{n % 7:04d}", "seller": f"ACC{7 + n % 5:04d}",
        "executed_at": f"{DAY}T14:{n % 60:02d}:00.5+00:00"}).encode()
    return Msg(value, TYPE_TRADE, partition)


def day_messages(builder: Builder, rng: random.Random, partitions: int, tag: str
                 ) -> list[tuple[Msg, str]]:
    """Adversarial messages with a good day interleaved (in its order, at random places),
    then the good day's close markers."""
    seqs = dict.fromkeys(range(partitions), 0)
    good = []
    for n in range(GOOD):
        p = rng.randrange(partitions)
        seqs[p] += 1
        good.append((good_trade(n, p, seqs[p], tag), GOOD_TRADE))
    adverse = [(builder.message(), ADVERSE) for _ in range(ADVERSARIAL)]
    slots = set(rng.sample(range(GOOD + ADVERSARIAL), GOOD))
    goods, others = iter(good), iter(adverse)
    out = [next(goods) if i in slots else next(others) for i in range(GOOD + ADVERSARIAL)]
    for p in range(partitions):
        value = json.dumps({"trade_date": DAY, "partition": p, "last_seq": seqs[p]}).encode()
        out.append((Msg(value, TYPE_CLOSE, p), GOOD_CLOSE))
    return out


def publish(settings: Settings, messages: list[tuple[Msg, str]], partitions: int
            ) -> list[Sent]:
    from confluent_kafka import Producer

    sent: list[Sent] = []
    errors: list[str] = []
    producer = Producer({**settings.kafka_client_config(), "enable.idempotence": True,
                         "acks": "all", "message.max.bytes": 4 << 20, "linger.ms": 5})
    for msg, role in messages:
        def report(err: Any, km: Any, msg: Msg = msg, role: str = role) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                sent.append(Sent(msg, role, km.partition(), km.offset()))

        headers = None if msg.headers is None else list(msg.headers)
        producer.produce(settings.topic, value=msg.value, headers=headers,
                         partition=msg.partition % partitions, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    return sent


def verdict(sent: Sent, max_bytes: int) -> tuple[str, Any]:
    """What the site's parser makes of a message: only to recognise a replayed trade id or a
    repeated close marker, whose second copy is (by design) the first one's row."""
    try:
        obj = decode(sent.msg.value, max_bytes)
        kind = message_type(None if sent.msg.headers is None else list(sent.msg.headers))
        if kind == C.TRADE:
            trade_copy_line(obj, sent.partition, sent.offset, "x")
            return "trade", obj["trade_id"]
        if kind == C.CLOSE:
            return "close", (close_marker(obj, sent.partition).trade_date, sent.partition)
    except Malformed:
        pass
    return "dead", None


def check_outcomes(settings: Settings, sent: list[Sent]) -> dict[str, int]:
    with connect(settings.ledger_dsn("a")) as conn:
        trades = {(p, o): t for t, p, o in conn.execute(
            "select trade_id, kafka_partition, kafka_offset from trades")}
        markers = {(p, o): (d.isoformat(), p) for d, p, o in conn.execute(
            "select trade_date, kafka_partition, kafka_offset from close_markers")}
        dead = {(p, o): r for p, o, r in conn.execute(
            "select kafka_partition, kafka_offset, reason from dead_letters")}
    ids, closed = set(trades.values()), set(markers.values())
    outcomes = {"trade": 0, "close": 0, "dead": 0, "replay": 0}
    vanished, reasonless, lost = [], [], []
    for s in sent:
        at = (s.partition, s.offset)
        stored = [k for k, table in (("trade", trades), ("close", markers), ("dead", dead))
                  if at in table]
        if len(stored) > 1:
            vanished.append((at, "more than one outcome", stored))
        elif stored:
            outcomes[stored[0]] += 1
            if stored == ["dead"] and not dead[at].strip():
                reasonless.append(at)
        else:
            kind, key = verdict(s, settings.max_message_bytes)
            if (kind == "trade" and key in ids) or (kind == "close" and key in closed):
                outcomes["replay"] += 1  # the copy stored first stands for it
            else:
                vanished.append((at, kind, s.msg.value[:120] if s.msg.value else None))
        if (s.role == GOOD_TRADE and at not in trades) or (
                s.role == GOOD_CLOSE and at not in markers):
            lost.append((at, s.role))
    assert not vanished, f"messages with no outcome: {vanished[:10]}"
    assert not reasonless, f"dead letters without a reason: {reasonless[:10]}"
    assert not lost, f"good messages lost: {lost[:10]}"
    return outcomes


def test_adversarial_messages_never_stop_the_line(services: Settings, tmp_path: Path) -> None:
    totals: dict[str, int] = {}

    @settings_(max_examples=EXAMPLES, deadline=None, database=None,
               # each example is a broker topic, ledgers and a site process: no shrinking
               phases=[Phase.generate],
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.large_base_example])
    @given(pool=pools(), seed=st.integers(0, 2**32 - 1))
    def example(pool: dict[str, Any], seed: int) -> None:
        # The good day's date must not be closed early by an adversarial close marker.
        assume(not any(DAY in str(v) for v in pool["valid_date"] + pool["date"]))
        refused_symbol = pool["valid_text"][0]
        assume(not refused_symbol.startswith("S"))  # the good day's symbols stay accepted
        with namespace(services) as (settings, env):
            with connect(settings.ledger_dsn("a")) as conn:
                conn.execute(sql.SQL("alter table trades add constraint not_this_symbol"
                                     " check (symbol <> {})").format(sql.Literal(refused_symbol)))
                conn.commit()
            rng = random.Random(seed)
            tag = f"{seed:x}"
            messages = day_messages(Builder(pool, seed), rng, settings.partitions, tag)
            sent = publish(settings, messages, settings.partitions)
            assert len(sent) == len(messages)
            log = tmp_path / f"site-{tag}.log"
            # Small batches: late trades and refusals land in batches of their own and others.
            out = wait_exit(start_site("a", "separate", {**env, "SETTLE_BATCH_SIZE": "64"},
                                       DAY, log), log, timeout=120)
            assert out["closed"], out
            for k, n in [*check_outcomes(settings, sent).items(), ("refused", out["refused"]),
                         ("late", out["late"])]:
                totals[k] = totals.get(k, 0) + n

    example()
    # The examples exercised every outcome, the database's refusals and late trades included.
    assert all(totals.get(k, 0) > 0 for k in ("trade", "close", "dead", "refused", "late")), \
        totals
