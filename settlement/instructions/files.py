"""The instruction files an operator sends to the settlement agent: CSV (the columns of
../shared/design.md) and ISO 20022 ``sese.023.001.11``, one ``SctiesSttlmTxInstr`` per line,
checked against its schema before the file is written.

How a line maps to sese.023 (securities settlement transaction instruction):
- ``SctiesMvmntTp`` RECE / DELI the quantity, ``Pmt`` APMT (against payment) when cash moves,
  FREE when only securities move; ``SttlmAmt`` with ``CdtDbtInd`` CRDT (the account receives,
  RECV) or DBIT (it pays, PAY);
- a cash-only line (the quantity netted to zero) is a payment free of delivery: quantity 0,
  APMT, and the movement type of the side that receives (DELI) or pays (RECE) the cash;
- ``SctiesTxTp`` NETT (the line is a multilateral net), the trade and settlement dates, the
  instrument by its ticker (``OthrId`` of proprietary type TICKER), the account as the
  safekeeping account: its ``Id`` holds at most 35 characters, the contract's accounts 64, so
  a longer account is identified by its first 26 characters, '~' and 8 hex digits of its
  SHA-256 (stable), with the whole account in ``Nm``.
"""

from __future__ import annotations

import csv
import hashlib
import io
from functools import cache
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from settlement.instructions.model import CSV_COLUMNS, LINK_COLUMNS, Instruction
from settlement.instructions.store import InstructionSet

SESE = "urn:iso:std:iso:20022:tech:xsd:sese.023.001.11"
FILE_NS = "urn:dual-site-settlement:instructions:1"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
FORMATS = ("csv", "iso20022")


def to_csv(lines: list[Instruction], linked: bool = False) -> str:
    """The contract's columns; with ``linked`` (custodian mode) also ``kind`` and ``links``."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS + LINK_COLUMNS if linked else CSV_COLUMNS)
    w.writerows(line.csv_row(linked) for line in lines)
    return out.getvalue()


class _Node:
    """One sese.023 element (prefix ``sese:``): its text or its children, and attributes.
    The file is rendered from these by ``_render`` rather than by ElementTree, whose
    serializer is Python and took 0.4 s of a 2,000-trade close's 0.8 s of instructions
    (2,533 documents; this: under 0.1 s). The output is the same text ElementTree's
    ``indent`` and ``tostring`` gave, and every file is parsed back and schema-checked."""

    __slots__ = ("attrs", "children", "name", "text")

    def __init__(self, name: str) -> None:
        self.name = name
        self.text: str | None = None
        self.attrs: dict[str, str] = {}
        self.children: list[_Node] = []


def _sub(parent: _Node, path: str, text: str | None = None, **attrs: str) -> _Node:
    """Nested elements by a '/'-separated path of sese.023 names; the last gets ``text``."""
    node = parent
    for name in path.split("/"):
        child = _Node(name)
        node.children.append(child)
        node = child
    node.attrs.update(attrs)
    if text is not None:
        node.text = text
    return node


def _render(node: _Node, depth: int, out: list[str]) -> None:
    """``node`` as indented XML text, two spaces a level (ElementTree's ``indent``)."""
    pad = "  " * depth
    attrs = "".join(f" {k}={quoteattr(v)}" for k, v in node.attrs.items())
    if node.children:
        out.append(f"{pad}<sese:{node.name}{attrs}>\n")
        for child in node.children:
            _render(child, depth + 1, out)
        out.append(f"{pad}</sese:{node.name}>\n")
    elif node.text is None:
        out.append(f"{pad}<sese:{node.name}{attrs} />\n")
    else:
        out.append(f"{pad}<sese:{node.name}{attrs}>{escape(node.text)}</sese:{node.name}>\n")


ACCOUNT_ID_MAX = 35  # ISO 20022 Max35Text


def account_id(account: str) -> str:
    """The safekeeping account's ``Id``: the account itself when it fits, else a stable
    shortening (its head and a digest), unique for all practical purposes."""
    if len(account) <= ACCOUNT_ID_MAX:
        return account
    digest = hashlib.sha256(account.encode("utf-8")).hexdigest()[:8]
    return f"{account[:ACCOUNT_ID_MAX - 9]}~{digest}"


def _document(line: Instruction, currency: str) -> _Node:
    doc = _Node("Document")
    tx = _sub(doc, "SctiesSttlmTxInstr")
    _sub(tx, "TxId", line.instruction_id)
    movement = line.side if line.side != "NONE" else ("DELI" if line.payment == "RECV"
                                                      else "RECE")
    params = _sub(tx, "SttlmTpAndAddtlParams")
    _sub(params, "SctiesMvmntTp", movement)
    _sub(params, "Pmt", "FREE" if line.payment == "NONE" else "APMT")
    trade = _sub(tx, "TradDtls")
    for carried in (c for c in line.carried_from.split(";") if c):
        _sub(trade, "TradId", f"CARRIED {carried}")
    _sub(trade, "TradDt/Dt/Dt", line.trade_date)
    _sub(trade, "SttlmDt/Dt/Dt", line.settlement_date)
    other = _sub(tx, "FinInstrmId/OthrId")
    _sub(other, "Id", line.symbol)
    _sub(other, "Tp/Prtry", "TICKER")
    qty = _sub(tx, "QtyAndAcctDtls")
    _sub(qty, "SttlmQty/Qty/Unit", str(line.quantity))
    account = _sub(qty, "SfkpgAcct")
    _sub(account, "Id", account_id(line.account))
    if account_id(line.account) != line.account:
        _sub(account, "Nm", line.account)
    _sub(tx, "SttlmParams/SctiesTxTp/Cd", "NETT")
    if line.payment != "NONE":
        amount = _sub(tx, "SttlmAmt")
        _sub(amount, "Amt", f"{line.amount:.4f}", Ccy=currency)
        _sub(amount, "CdtDbtInd", "CRDT" if line.payment == "RECV" else "DBIT")
    return doc


def to_iso20022(day: InstructionSet, currency: str) -> str:
    """The day's instructions as one file of sese.023 documents, schema-checked."""
    head = " ".join(f"{k}={quoteattr(v)}" for k, v in (
        ("xmlns", FILE_NS), ("xmlns:sese", SESE), ("tradeDate", day.trade_date),
        ("settlementDate", day.settlement_date), ("runId", str(day.run_id)),
        ("version", str(day.version))))
    out = ["<?xml version='1.0' encoding='utf-8'?>\n", f"<SttlmInstrs {head}>\n"]
    for line in day.lines:
        _render(_document(line, currency), 1, out)
    out.append("</SttlmInstrs>\n")
    text = "".join(out)
    check_iso20022(text)
    return text


@cache
def _schema() -> Any:
    from lxml import etree

    return etree.XMLSchema(etree.parse(str(SCHEMAS / "instructions-file.xsd")))


def check_iso20022(text: str) -> None:
    """Raise ``ValueError`` naming the first violation of the sese.023 schema (subset).
    libxml2's validator: a day of thousands of lines checks in milliseconds (a pure-Python
    validator took seconds, paid by every close)."""
    from lxml import etree

    schema = _schema()
    try:
        doc = etree.fromstring(text.encode("utf-8"))
    except etree.XMLSyntaxError as e:
        raise ValueError(f"the ISO 20022 instructions fail their schema: not XML: {e}") from None
    if not schema.validate(doc):
        err = schema.error_log.last_error
        raise ValueError(f"the ISO 20022 instructions fail their schema: {err.message} "
                         f"(line {err.line})")


def render(day: InstructionSet, fmt: str, currency: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "csv":
        return to_csv(day.lines, linked=day.mode == "custodian")
    if day.mode == "custodian":
        raise ValueError("a custodian-mode set's messages need the reference data: "
                         "settlement.instructions.render_set")
    return to_iso20022(day, currency)


def default_path(reports_dir: Path, day: InstructionSet, fmt: str, kind: str = "") -> Path:
    """Next to the audit reports: one file per run, format and kind ("" or "delta"): a run's
    lines never change."""
    ext = "csv" if fmt == "csv" else "xml"
    suffix = f"-{kind}" if kind else ""
    return reports_dir / "instructions" / f"{day.trade_date}-run{day.run_id}{suffix}.{ext}"


