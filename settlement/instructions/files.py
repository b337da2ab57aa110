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
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path
from typing import Any

from settlement.instructions.model import CSV_COLUMNS, Instruction
from settlement.instructions.store import InstructionSet
from settlement.services.procs import write_private

SESE = "urn:iso:std:iso:20022:tech:xsd:sese.023.001.11"
FILE_NS = "urn:dual-site-settlement:instructions:1"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
FORMATS = ("csv", "iso20022")


def to_csv(lines: list[Instruction]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    w.writerows(line.csv_row() for line in lines)
    return out.getvalue()


def _sub(parent: ET.Element, path: str, text: str | None = None,
         **attrs: str) -> ET.Element:
    """Nested elements by a '/'-separated path of sese.023 names; the last gets ``text``."""
    node = parent
    for name in path.split("/"):
        node = ET.SubElement(node, f"{{{SESE}}}{name}")
    node.attrib.update(attrs)
    if text is not None:
        node.text = text
    return node


ACCOUNT_ID_MAX = 35  # ISO 20022 Max35Text


def account_id(account: str) -> str:
    """The safekeeping account's ``Id``: the account itself when it fits, else a stable
    shortening (its head and a digest), unique for all practical purposes."""
    if len(account) <= ACCOUNT_ID_MAX:
        return account
    digest = hashlib.sha256(account.encode("utf-8")).hexdigest()[:8]
    return f"{account[:ACCOUNT_ID_MAX - 9]}~{digest}"


def _document(line: Instruction, currency: str) -> ET.Element:
    doc = ET.Element(f"{{{SESE}}}Document")
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
    ET.register_namespace("", FILE_NS)
    ET.register_namespace("sese", SESE)
    root = ET.Element(f"{{{FILE_NS}}}SttlmInstrs", {
        "tradeDate": day.trade_date, "settlementDate": day.settlement_date,
        "runId": str(day.run_id), "version": str(day.version)})
    for line in day.lines:
        root.append(_document(line, currency))
    ET.indent(root)
    text = ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
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
    return to_csv(day.lines) if fmt == "csv" else to_iso20022(day, currency)


def default_path(reports_dir: Path, day: InstructionSet, fmt: str, kind: str = "") -> Path:
    """Next to the audit reports: one file per run, format and kind ("" or "delta"): a run's
    lines never change."""
    ext = "csv" if fmt == "csv" else "xml"
    suffix = f"-{kind}" if kind else ""
    return reports_dir / "instructions" / f"{day.trade_date}-run{day.run_id}{suffix}.{ext}"


def write(day: InstructionSet, fmt: str, path: Path, currency: str) -> Path:
    """Write for the owner only (every account's obligations, as the audit reports) and
    atomically (a temporary file renamed): a reader never sees half a file."""
    write_private(path, render(day, fmt, currency))
    return path
