"""Adversarial Kafka messages for property-based tests, shared by the parser parity test
(``tests/test_parity.py``: both parsers, one verdict) and the end-to-end ingest test
(``tests/test_ingest_property.py``: a real broker and a real site).

Hypothesis draws ``pools`` of field values, valid and adversarial, for every field of a trade
and a close marker (types, ranges, lengths, unicode and control characters, surrogates,
dates, timestamps, prices, JSON oddities, headers); a ``Builder`` seeded by hypothesis
assembles messages from them: valid ones, ones with a field at a rule's edge, mutated ones
(missing, repeated and extra keys, nesting, long numbers, broken surrogates, leading and
trailing bytes), byte-level damage (invalid UTF-8), values at the size limit, any JSON value,
and junk. Drawing every message through hypothesis would exceed its per-example data budget
long before a batch is big enough to be worth a Spark job or a broker round trip.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from settlement import contract as C

# Large enough for the key-length limit (a key of 50,000 UTF-16 units takes up to 100 kB).
MAX_BYTES = 128 * 1024
Headers = tuple[tuple[str, bytes | None], ...] | None
TYPE_TRADE: Headers = ((C.TYPE_HEADER, C.TRADE.encode()),)
TYPE_CLOSE: Headers = ((C.TYPE_HEADER, C.CLOSE.encode()),)


@dataclass(frozen=True)
class Msg:
    """One Kafka record as both parsers receive it."""

    value: bytes | None
    headers: Headers = TYPE_TRADE
    partition: int = 0


def jstr(s: str, escape: Callable[[str], bool] = lambda ch: False, upper: bool = False) -> str:
    """A JSON string literal; control characters and the chosen ones as \\u escapes."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or escape(ch):
            units = [o] if o <= 0xFFFF else [0xD800 + ((o - 0x10000) >> 10),
                                             0xDC00 + ((o - 0x10000) & 0x3FF)]
            out.extend(f"\\u{u:04X}" if upper else f"\\u{u:04x}" for u in units)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def nest(depth: int) -> str:
    """A JSON value nested ``depth`` levels deep (1 = a flat array)."""
    return "[" * depth + "]" * depth


PRINTABLE = st.characters(exclude_categories=("Cs", "Cc"))  # what text fields may hold
NASTY = [
    "\t", "\n", "\r", "\x00", "\x01", "\x1b", "\x1f", "\x7f", "\x80", "\x85", "\x9f", "\xa0",
    "\\", '"', "/", "'", "{", "}", "[", "]", ":", ",", " ", "\u2028", "\u2029", "\u200b",
    "\ufeff", "\ufffd", "\uffff", "\U0001f600", "\U0010ffff", "é", "İ", "ß", "０", "٣",
]  # fmt: skip
ANY_CHAR = st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(NASTY))
VALID_DATES = st.dates(C.MIN_DATE, C.MAX_DATE).map(dt.date.isoformat)
ZONES = ["Z", "+00:00", "-00:00", "+05:30", "-03:00", "+14:59", "-14:59", "+01:00"]


def _ts(d: str, h: int, m: int, s: int, frac: str, zone: str, sep: str = "T") -> str:
    return f"{d}{sep}{h:02d}:{m:02d}:{s:02d}{'.' + frac if frac else ''}{zone}"


VALID_TIMESTAMPS = st.builds(
    _ts, VALID_DATES, st.integers(0, 23), st.integers(0, 59), st.integers(0, 59),
    st.text("0123456789", max_size=6), st.sampled_from(ZONES),
)  # fmt: skip
VALID_PRICES = st.builds(
    lambda i, frac: f"{i}.{frac}" if frac else str(i),
    st.one_of(st.integers(0, 10**14 - 1), st.integers(0, 1000)),
    st.text("0123456789", max_size=C.PRICE_SCALE),
).filter(lambda p: p.strip("0.") != "")

VALID = {
    "text": st.text(PRINTABLE, min_size=1, max_size=C.SYMBOL.max_length),
    "date": VALID_DATES,
    "timestamp": VALID_TIMESTAMPS,
    "price": VALID_PRICES,
    "seq": st.one_of(st.integers(C.SEQ.minimum, C.SEQ.maximum), st.integers(1, 999)),
    "quantity": st.integers(C.QUANTITY.minimum, C.QUANTITY.maximum),
    "partition": st.integers(0, 5),
}
# Values of any JSON type, rendered as tokens (for extra fields and wrong types).
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(ANY_CHAR, max_size=8)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6,
).map(lambda v: json.dumps(v, ensure_ascii=False))
ODD_TOKENS = st.sampled_from([
    "true", "false", "null", "0", "-0", "1", "1.0", "10.0", "1e2", "1E+2", "-1", "0.5", "{}",
    "[]", '""', '"1"', '" "', "1e400", "-1e400", "1e-400", str(2**63), str(2**64), str(2**63 - 1),
    "9" * 309, "0." + "0" * 999, "-" + "1" * 999, '"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"',
    "NaN", "Infinity", "01", "+1", ".5", "1.", "tru", "'x'", "[1,]", '"a\\x"', nest(C.MAX_DEPTH),
    nest(C.MAX_DEPTH - 1), '{"a":1,"a":1}',
])  # fmt: skip
ADVERSARIAL = {
    "text": st.one_of(
        st.text(ANY_CHAR, max_size=70),
        st.integers(0, 70).map(lambda n: "x" * n),
        st.tuples(st.text(PRINTABLE, max_size=5), st.sampled_from(NASTY)).map("".join),
    ),
    "date": st.one_of(
        st.dates().map(dt.date.isoformat),
        st.builds("{:04d}-{:02d}-{:02d}".format, st.integers(0, 10000), st.integers(0, 13),
                  st.integers(0, 32)),
        st.tuples(VALID_DATES, st.sampled_from(NASTY + ["T00:00:00", "Z"])).map("".join),
        st.sampled_from(["20261123", "2026-W48-1", " 2026-11-23", "２０２６-11-23", "2026/11/23",
                         "2026-1-5", "", "+2026-11-23"]),
    ),
    "timestamp": st.one_of(
        st.builds(_ts, st.one_of(VALID_DATES, st.dates().map(dt.date.isoformat)),
                  st.integers(0, 25), st.integers(0, 61), st.integers(0, 61),
                  st.text("0123456789", max_size=8),
                  st.one_of(st.sampled_from(["", "z", "+0530", "+05", "+15:00", "-16:00",
                                             "+24:00", " Z", "UTC", "Z\n", "+14:60"]),
                            st.builds("{}{:02d}:{:02d}".format, st.sampled_from("+-"),
                                      st.integers(0, 19), st.integers(0, 60))),
                  st.sampled_from(["T", "T", " ", "t"])),
        st.tuples(VALID_TIMESTAMPS, st.sampled_from(NASTY)).map("".join),
    ),
    "price": st.one_of(
        st.from_regex(r"[-+ ]?[0-9]{0,16}(\.[0-9]{0,6})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
        st.decimals(allow_nan=True, allow_infinity=True).map(str),
        st.tuples(st.sampled_from(["0", "00", " ", "+", "-"]), VALID_PRICES).map("".join),
        st.tuples(VALID_PRICES, st.sampled_from(NASTY + ["0", "00", "e1"])).map("".join),
    ),
    "int": st.one_of(
        st.integers().map(str),
        st.sampled_from([0, -1, C.MAX_SEQ, C.MAX_SEQ + 1, C.MAX_QUANTITY, C.MAX_QUANTITY + 1,
                         C.MAX_PARTITION, C.MAX_PARTITION + 1, 2**63 - 1, 2**63, -(2**63) - 1,
                         2**64, 2**64 + 1]).map(str),
        st.floats().map(lambda f: json.dumps(f) if f == f and abs(f) != float("inf") else "1.5"),
        ODD_TOKENS,
    ),
    "json": st.one_of(JSON_VALUES, ODD_TOKENS),
}
HEADER_VARIANTS: list[Headers] = [
    None, (), ((C.TYPE_HEADER, None),), ((C.TYPE_HEADER, b""),), ((C.TYPE_HEADER, b"TRADE"),),
    ((C.TYPE_HEADER, b"heartbeat"),), ((C.TYPE_HEADER, b"trade\xff"),), (("Type", b"close"),),
    (("x", b"y"), (C.TYPE_HEADER, b"trade")), (("x", b"y"), (C.TYPE_HEADER, b"close")),
    ((C.TYPE_HEADER, b"trade"), (C.TYPE_HEADER, b"close")),
    ((C.TYPE_HEADER, b"close"), (C.TYPE_HEADER, b"trade")),
    TYPE_TRADE, TYPE_CLOSE,
]  # fmt: skip
TRAILERS = [
    "", " ", "\n", "\t\r\n ", "{}", '{"a":1}', " x}", "}", "]", ",", "\x0c", "\x00", "\xa0", '"',
    "1", "null", "//", "\ufeff", "}}", "]}", " {",
]  # fmt: skip
LEADERS = ["", " ", "\n\t", "\ufeff", "[", "x", "\x0c"]


@st.composite
def pools(draw: st.DrawFn) -> dict[str, list[str] | list[int]]:
    """Per batch: some values of every kind, valid and adversarial."""
    out: dict[str, Any] = {}
    for name, strategy in VALID.items():
        out[f"valid_{name}"] = draw(st.lists(strategy, min_size=4, max_size=25))
    for name, strategy in ADVERSARIAL.items():
        out[name] = draw(st.lists(strategy, min_size=4, max_size=25))
    return out


class Builder:
    """Messages from a pool of values, chosen by a seeded generator."""

    def __init__(self, pool: dict[str, Any], seed: int):
        self.p, self.r = pool, random.Random(seed)

    def pick(self, name: str) -> Any:
        return self.r.choice(self.p[name])

    def text(self, s: str) -> str:
        """A JSON string for s, escaping a random share of its characters."""
        share = self.r.choice([0.0, 0.0, 0.0, 0.2, 1.0])
        upper = self.r.random() < 0.3
        return jstr(s, lambda ch: self.r.random() < share, upper)

    def valid_trade(self) -> list[tuple[str, str]]:
        p = self.pick
        buyer = p("valid_text")
        seller = p("valid_text")
        return [
            ("trade_id", self.text(p("valid_text"))),
            ("trade_date", self.text(p("valid_date"))),
            ("seq", str(p("valid_seq"))),
            ("symbol", self.text(p("valid_text"))),
            ("price", self.text(p("valid_price"))),
            ("quantity", str(p("valid_quantity"))),
            ("buyer", self.text(buyer)),
            ("seller", self.text(seller if seller != buyer else seller + "2")),
            ("executed_at", self.text(p("valid_timestamp"))),
        ]

    def valid_close(self, partition: int) -> list[tuple[str, str]]:
        return [("trade_date", self.text(self.pick("valid_date"))),
                ("partition", str(partition)), ("last_seq", str(self.pick("valid_seq")))]

    def near_miss(self, key: str) -> str:
        """A valid value of this field changed just enough to probe one rule's edge (the
        result may still be valid: the edge is the point)."""
        r, p = self.r, self.pick
        limits = {f.name: f.max_length for f in C.TEXT_FIELDS}
        ints = {f.name: f for f in (*C.INT_FIELDS, C.CLOSE_PARTITION, C.CLOSE_LAST_SEQ)}
        if key in limits:
            n = limits[key]
            s = p("valid_text")
            return self.text(r.choice([
                "", s[:1] * n, (s * n)[: n + 1], s + r.choice(NASTY), r.choice(NASTY) + s,
                s.upper(), s + "\U0001f600" * (n - len(s)), s + "\U0001f600" * (n + 1 - len(s)),
            ]))
        if key == "trade_date":
            d = p("valid_date")
            return self.text(r.choice([
                d[:8] + r.choice(["29", "30", "31", "00", "32"]), d[:5] + r.choice(["00", "13"])
                + d[7:], r.choice(["1999", "2100", "2000", "2099"]) + d[4:], d.replace("-", ""),
                d + r.choice(["\n", " ", "T00:00:00", "Z"]), d[:5] + d[5:].replace("0", "", 1),
            ]))
        if key == "executed_at":
            t = p("valid_timestamp")
            base, zone = (t[:-1], "Z") if t.endswith("Z") else (t[:-6], t[-6:])
            return self.text(r.choice([
                base, base + "z", base + zone.replace(":", ""), base + zone[:3],
                base.replace("T", " ") + zone, base[:17] + "60" + base[19:] + zone,
                base[:11] + "24" + base[13:] + zone, base + ("" if "." in base else ".")
                + "1234567"[: 7 - len(base.partition(".")[2])] + zone,
                base + r.choice(["+15:00", "-15:00", "+14:60", "+14:59", "-00:00"]),
                base[:8] + r.choice(["29", "30", "31"]) + base[10:] + zone, t + "\n",
            ]))
        if key == "price":
            v = p("valid_price")
            i, _, f = v.partition(".")
            return self.text(r.choice([
                "0" + v, "00" + v, v + "0" * (5 - len(f)) if f else v + ".00000", "-" + v,
                "+" + v, " " + v, v + "e0", "." + (f or "5"), i + ".", i + "0" * 14,
                "0." + "0" * len(f or "0"), f"{v}\n", "0", v.replace(".", ","),
            ]))
        if key in ints:
            f = ints[key]
            return r.choice([str(f.minimum - 1), str(f.minimum), str(f.maximum),
                             str(f.maximum + 1), str(2**63), "-0", f"{f.minimum}.0", "1e2",
                             "true", f'"{f.minimum}"', "null"])
        return self.pick("json")

    def adversarial_value(self, key: str) -> str:
        """A wrong token for this field: the right kind at a rule's edge, the right kind
        broken, or another kind of value."""
        r = self.r
        own = {"trade_id": "text", "symbol": "text", "buyer": "text", "seller": "text",
               "trade_date": "date", "executed_at": "timestamp", "price": "price"}.get(key)
        roll = r.random()
        if roll < 0.5:
            return self.near_miss(key)
        if own and roll < 0.8:
            return self.text(self.pick(own))
        if own is None and roll < 0.8:
            return self.pick("int")
        kind = r.choice(["text", "date", "timestamp", "price"])
        return r.choice([self.text(self.pick(kind)), self.pick("int"), self.pick("json")])

    def mutate(self, pairs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], str, str]:
        """Apply one to three changes; returns the pairs and a leader and trailer."""
        r = self.r
        lead, trail = "", ""
        for _ in range(r.choice([1, 1, 1, 2, 3])):
            op = r.randrange(12)
            i = r.randrange(len(pairs))
            key = pairs[i][0]
            if op <= 3:  # a wrong value
                pairs[i] = (key, self.adversarial_value(key))
            elif op == 4:  # a missing field
                del pairs[i]
                if not pairs:
                    pairs = [("x", "1")]
            elif op == 5:  # a repeated key, before or after, same or other value
                value = r.choice([pairs[i][1], self.adversarial_value(key)])
                pairs.insert(r.randrange(len(pairs) + 1), (key, value))
            elif op == 6:  # extra fields
                for _ in range(r.randint(1, 3)):
                    name = r.choice([self.pick("text"), key.upper(), "x", ""])
                    pairs.insert(r.randrange(len(pairs) + 1), (name, self.pick("json")))
            elif op == 7:  # nesting around the limit
                arrays = r.randint(C.MAX_DEPTH - 4, C.MAX_DEPTH)
                opener, closer = r.choice([("[", "]"), ('{"k":', "}")])
                inner = r.choice(["1", '"x"', "{}", "[]"])
                pairs.append(("n", opener + "[" * arrays + inner + "]" * arrays + closer))
            elif op == 8:  # a number around the length limit
                n = r.randint(C.MAX_NUMBER_LENGTH - 3, C.MAX_NUMBER_LENGTH + 1)
                pairs.append(("num", r.choice(["0.", "-0.", "1"]) + "0" * n))
            elif op == 9:  # a lone or broken surrogate inside a string
                bad = r.choice(["\\ud800", "\\uDBFF", "\\udc00", "\\ud83d\\u0041", "\\ude00\\ud83d",
                                "\\ud83d\\ude00"])
                v = pairs[i][1]
                if v.startswith('"'):
                    cut = r.randint(1, len(v) - 1)
                    pairs[i] = (key, v[:cut] + bad + v[cut:])
            elif op == 10:
                lead = r.choice(LEADERS)
            else:
                trail = r.choice(TRAILERS)
        return pairs, lead, trail

    def render(self, pairs: list[tuple[str, str]], lead: str = "", trail: str = "") -> bytes:
        r = self.r
        if r.random() < 0.3:
            r.shuffle(pairs)
        sep, colon = r.choice([("", ":"), ("", ":"), (" ", ": "), ("\n  ", ": "), ("\t", " :")])
        body = ("," + sep).join(f"{self.text(k)}{colon}{v}" for k, v in pairs)
        return (lead + "{" + sep + body + sep + "}" + trail).encode("utf-8", "surrogatepass")

    def corrupt(self, value: bytes) -> bytes:
        """Byte-level damage: invalid UTF-8, a byte lost, flipped, or the value cut short."""
        r = self.r
        i = r.randrange(len(value) + 1)
        op = r.randrange(4)
        if op == 0:
            bad = r.choice([b"\xff", b"\xc3", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                            b"\x80", b"\xe2\x82", b"\xf0\x9f\x98"])
            return value[:i] + bad + value[i:]
        if op == 1:
            return value[:i] + value[i + 1:]
        if op == 2 and i < len(value):
            return value[:i] + bytes([value[i] ^ (1 << r.randrange(8))]) + value[i + 1:]
        return value[:i]

    def message(self) -> Msg:
        r = self.r
        roll = r.random()
        partition = self.pick("valid_partition")
        if roll < 0.75:
            is_close = r.random() < 0.15
            pairs = self.valid_close(partition) if is_close else self.valid_trade()
            headers = TYPE_CLOSE if is_close else r.choice([TYPE_TRADE] * 4 + [None, ()])
            lead = trail = ""
            roll = r.random()
            if roll < 0.25:  # one field at the edge of its rule, the rest valid
                i = r.randrange(len(pairs))
                pairs[i] = (pairs[i][0], self.near_miss(pairs[i][0]))
            elif roll < 0.6:
                pairs, lead, trail = self.mutate(pairs)
            value = self.render(pairs, lead, trail)
            if r.random() < 0.05:
                value = self.corrupt(value)
            if r.random() < 0.06:
                headers = r.choice(HEADER_VARIANTS)
            if is_close and r.random() < 0.1:
                partition = r.choice([partition + 1, 0, C.MAX_PARTITION])
            return Msg(value, headers, partition)
        if roll < 0.8:  # a value at the size limit, either side of it
            pad = "x" * (MAX_BYTES - r.randint(200, 330))
            return Msg(self.render([*self.valid_trade(), ("pad", jstr(pad))]), TYPE_TRADE)
        if roll < 0.9:  # any JSON value at all
            return Msg(self.pick("json").encode("utf-8", "surrogatepass"), TYPE_TRADE)
        junk = bytes(r.randrange(256) for _ in range(r.randrange(12)))
        return Msg(r.choice([junk, b"", None]), r.choice(HEADER_VARIANTS))
