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


ACCOUNT_ID_MAX = 35  # ISO 20022 Max35Text


def account_id(account: str) -> str:
    """The safekeeping account's ``Id``: the account itself when it fits, else a stable
    shortening (its head and a digest), unique for all practical purposes."""
    if len(account) <= ACCOUNT_ID_MAX:
        return account
    digest = hashlib.sha256(account.encode("utf-8")).hexdigest()[:8]
    return f"{account[:ACCOUNT_ID_MAX - 9]}~{digest}"


def _element(out: list[str], depth: int, name: str, text: str, attrs: str = "") -> None:
    out.append(f"{'  ' * depth}<sese:{name}{attrs}>{escape(text)}</sese:{name}>\n")


def _document(out: list[str], line: Instruction, currency: str) -> None:
    """One sese.023 ``Document`` at depth 1, written as text: ElementTree's serializer is
    Python and took 0.4 s of a 2,000-trade close's 0.8 s of instructions, and a tree of
    nodes rendered recursively still 0.6 s of the 2M-trade day's 1.1 s (12,000 documents).
    The text is what ElementTree's ``indent`` (two spaces a level) and ``tostring`` give
    (``tests/test_instructions.py`` holds it to them), and every file is parsed back and
    schema-checked."""
    movement = line.side if line.side != "NONE" else ("DELI" if line.payment == "RECV"
                                                      else "RECE")
    ident = account_id(line.account)
    out.append("  <sese:Document>\n    <sese:SctiesSttlmTxInstr>\n")
    _element(out, 3, "TxId", line.instruction_id)
    out.append("      <sese:SttlmTpAndAddtlParams>\n")
    _element(out, 4, "SctiesMvmntTp", movement)
    _element(out, 4, "Pmt", "FREE" if line.payment == "NONE" else "APMT")
    out.append("      </sese:SttlmTpAndAddtlParams>\n      <sese:TradDtls>\n")
    for carried in (c for c in line.carried_from.split(";") if c):
        _element(out, 4, "TradId", f"CARRIED {carried}")
    for name, day in (("TradDt", line.trade_date), ("SttlmDt", line.settlement_date)):
        out.append(f"        <sese:{name}>\n          <sese:Dt>\n")
        _element(out, 6, "Dt", day)
        out.append(f"          </sese:Dt>\n        </sese:{name}>\n")
    out.append("      </sese:TradDtls>\n      <sese:FinInstrmId>\n        <sese:OthrId>\n")
    _element(out, 5, "Id", line.symbol)
    out.append("          <sese:Tp>\n            <sese:Prtry>TICKER</sese:Prtry>\n"
               "          </sese:Tp>\n        </sese:OthrId>\n      </sese:FinInstrmId>\n"
               "      <sese:QtyAndAcctDtls>\n        <sese:SttlmQty>\n          <sese:Qty>\n")
    _element(out, 6, "Unit", str(line.quantity))
    out.append("          </sese:Qty>\n        </sese:SttlmQty>\n        <sese:SfkpgAcct>\n")
    _element(out, 5, "Id", ident)
    if ident != line.account:
        _element(out, 5, "Nm", line.account)
    out.append("        </sese:SfkpgAcct>\n      </sese:QtyAndAcctDtls>\n"
               "      <sese:SttlmParams>\n        <sese:SctiesTxTp>\n"
               "          <sese:Cd>NETT</sese:Cd>\n        </sese:SctiesTxTp>\n"
               "      </sese:SttlmParams>\n")
    if line.payment != "NONE":
        out.append("      <sese:SttlmAmt>\n")
        _element(out, 4, "Amt", f"{line.amount:.4f}", f" Ccy={quoteattr(currency)}")
        _element(out, 4, "CdtDbtInd", "CRDT" if line.payment == "RECV" else "DBIT")
        out.append("      </sese:SttlmAmt>\n")
    out.append("    </sese:SctiesSttlmTxInstr>\n  </sese:Document>\n")


def to_iso20022(day: InstructionSet, currency: str) -> str:
    """The day's instructions as one file of sese.023 documents, schema-checked."""
    head = " ".join(f"{k}={quoteattr(v)}" for k, v in (
        ("xmlns", FILE_NS), ("xmlns:sese", SESE), ("tradeDate", day.trade_date),
        ("settlementDate", day.settlement_date), ("runId", str(day.run_id)),
        ("version", str(day.version))))
    out = ["<?xml version='1.0' encoding='utf-8'?>\n", f"<SttlmInstrs {head}>\n"]
    for line in day.lines:
        _document(out, line, currency)
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


