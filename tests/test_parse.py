"""Message validation: every malformed kind has a reason; valid trades become COPY lines."""

from __future__ import annotations

import json
import random

import pytest

from consumers.parse import Malformed, close_marker, decode, message_type, trade_copy_line
from settlement.simulator.gateway import MALFORMED_KINDS, DayGenerator, SimulationSpec, malformed_message

GOOD = {
    "trade_id": "T1", "trade_date": "2026-11-23", "seq": 1, "symbol": "AAPL",
    "price": "187.2500", "quantity": 100, "buyer": "ACC0001", "seller": "ACC0002",
    "executed_at": "2026-11-23T14:30:00.000001Z",
}


def _line(obj: dict) -> str:
    return trade_copy_line(decode(json.dumps(obj).encode(), 16384), 2, 41, "a")


def test_valid_trade_becomes_a_copy_line() -> None:
    assert _line(GOOD).split("\t") == [
        "T1", "2026-11-23", "1", "2", "41", "AAPL", "187.2500", "100", "ACC0001", "ACC0002",
        "2026-11-23T14:30:00.000001Z", "a\n",
    ]


def test_copy_special_characters_are_escaped() -> None:
    line = _line({**GOOD, "buyer": "A\tB\\C\nD"})
    assert "A\\tB\\\\C\\nD" in line
    assert line.count("\t") == 11 and line.count("\n") == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"quantity": -5}, "quantity must be positive"),
        ({"quantity": 0}, "quantity must be positive"),
        ({"quantity": "5"}, "quantity must be an integer"),
        ({"quantity": True}, "quantity must be an integer"),
        ({"price": 1.5}, "price must be a decimal string"),
        ({"price": "abc"}, "price must be a positive decimal"),
        ({"price": "-1"}, "price must be a positive decimal"),
        ({"price": "NaN"}, "price must be a positive decimal"),
        ({"price": "1E+3"}, "price must be a positive decimal"),
        ({"price": "1.00001"}, "at most 14 integer digits and 4 decimal places"),
        ({"price": "123456789012345"}, "at most 14 integer digits"),
        ({"price": "0.0000"}, "price must be positive"),
        ({"buyer": "A\u0000B"}, "must not contain NUL"),
        ({"seller": "ACC0001"}, "buyer equals seller"),
        ({"trade_date": "2026-02-30"}, "unknown trade_date"),
        ({"trade_date": 20261123}, "trade_date must be a YYYY-MM-DD string"),
        ({"executed_at": "yesterday"}, "executed_at is not ISO-8601"),
        ({"executed_at": "2026-11-23T14:30:00"}, "no time zone"),
        ({"seq": 0}, "seq must be positive"),
        ({"trade_id": ""}, "trade_id must be a non-empty string"),
    ],
)
def test_invalid_fields_are_named(change: dict, reason: str) -> None:
    with pytest.raises(Malformed, match=reason):
        _line({**GOOD, **change})


@pytest.mark.parametrize("field", sorted(GOOD))
def test_missing_field_is_named(field: str) -> None:
    obj = {k: v for k, v in GOOD.items() if k != field}
    with pytest.raises(Malformed, match=f"missing field '{field}'"):
        _line(obj)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "empty message"),
        (b"\xff\xfe", "invalid UTF-8"),
        (b'{"trade_id": ', "invalid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b"x" * 20000, "oversized"),
    ],
)
def test_undecodable_messages(raw: bytes | None, reason: str) -> None:
    with pytest.raises(Malformed, match=reason):
        decode(raw, 16384)


def test_every_gateway_malformed_kind_is_rejected() -> None:
    rng = random.Random(1)
    trade = next(iter(DayGenerator(SimulationSpec("2026-11-23", 10), 6).trades()))
    for kind in MALFORMED_KINDS:
        raw = malformed_message(kind, trade, rng)
        with pytest.raises(Malformed):
            trade_copy_line(decode(raw, 16384), trade.partition, 0, "a")


def test_close_marker_checks_its_partition() -> None:
    obj = {"trade_date": "2026-11-23", "partition": 3, "last_seq": 120}
    assert close_marker(obj, 3).last_seq == 120
    with pytest.raises(Malformed, match="arrived on partition 4"):
        close_marker(obj, 4)
    with pytest.raises(Malformed, match="missing field 'last_seq'"):
        close_marker({"trade_date": "2026-11-23", "partition": 3}, 3)


def test_message_type_header() -> None:
    assert message_type([("type", b"close")]) == "close"
    assert message_type([("type", b"trade")]) == "trade"
    assert message_type(None) == "trade"
