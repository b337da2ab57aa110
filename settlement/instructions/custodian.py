"""One obligation as a custodian or a CSD participant takes it (issue 59, custodian mode): a
``sese.023.001.11`` instruction under its ``head.001.001.02`` Business Application Header,
naming the security by ISIN and the settlement parties by BIC (settlement.instructions.refdata
supplies both), checked against the official schemas and against the market rules a schema
cannot say.

The schemas in ``schemas/iso20022/`` are the ISO 20022 Registration Authority's published
files, vendored byte for byte (``SOURCES.md`` there names each one's origin; ``SOURCES`` here
their SHA-256, checked by the tests). The rules checked in code (``rule_problems``):

- an amount in the currency's minor units (ISO 4217: USD 2 decimals, JPY none), where the
  schema allows five;
- a quantity above zero: a cash-only obligation is no securities movement, so it is not a
  sese.023;
- the counterparty's side of the chain complete: for a receipt the delivering parties, for a
  delivery the receiving ones, each with the depository (place of settlement) and the agent
  (``Pty1``) by BIC; the instructing party's own agent with its safekeeping account.

A set written in custodian mode (``SETTLE_INSTRUCTIONS_MODE=custodian``) is sent as one file
of messages (``messages``): each a head.001 ``AppHdr`` and its ``Document``, side by side in a
``Msg`` of a transport envelope of ours (``ENVELOPE``), as SWIFT's and the CSDs' file
channels carry a header and its document together; the envelope only groups them, and each
header and document is checked on its own against the official schema. A re-close's
cancellations are sese.020 documents naming the cancelled instruction; its new instructions
link the ones they replace (``Lnkgs``, processing position INFO). A line the reference data
cannot name (no ISIN for its symbol, no participant for its account) or a cash-only line is
held: listed with its reason, never sent with a placeholder.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from settlement.instructions.model import Instruction, minor_units
from settlement.instructions.refdata import Participant, Security

if TYPE_CHECKING:
    from settlement.instructions.store import InstructionSet

SESE023 = "urn:iso:std:iso:20022:tech:xsd:sese.023.001.11"
SESE020 = "urn:iso:std:iso:20022:tech:xsd:sese.020.001.07"
HEAD001 = "urn:iso:std:iso:20022:tech:xsd:head.001.001.02"
ENVELOPE = "urn:dual-site-settlement:messages:1"
OFFICIAL = Path(__file__).resolve().parent / "schemas" / "iso20022"
# Each vendored schema's SHA-256 (SOURCES.md says where it comes from).
SOURCES: dict[str, str] = {
    "sese.023.001.11.xsd": "35b44a54b8ac767fabca27a26cba700929f1859c2ad70b2a8f1c0967ec182aa4",
    "sese.020.001.07.xsd": "20e0fbeb380b1aa65188123e0743157ab9298597a170e6886032d3b31ebacfb5",
    "head.001.001.02.xsd": "60f4b0abf9da2511e9215a1f5ce92838c788bc64315fe39b9f77613c0f9a4470",
}
_NAMESPACE_FILE = {SESE023: "sese.023.001.11.xsd", SESE020: "sese.020.001.07.xsd",
                   HEAD001: "head.001.001.02.xsd"}


@dataclass(frozen=True)
class Parties:
    """Who the messages name besides the account's own participant."""

    sender_bic: str  # the firm sending the instructions (the header's From)
    receiver_bic: str  # the custodian or CSD taking them (the header's To)
    depository_bic: str  # the place of settlement, e.g. DTC's DTCYUS33
    counterparty_bic: str  # whom the net obligations face: the clearing house, e.g. NSCC


def _el(parent: Any, ns: str, path: str, text: str | None = None, **attrs: str) -> Any:
    from lxml import etree

    node = parent
    for name in path.split("/"):
        node = etree.SubElement(node, f"{{{ns}}}{name}")
    for key, value in attrs.items():
        node.set(key, value)
    if text is not None:
        node.text = text
    return node


def _party(parent: Any, path: str, depository: str, agent: str,
           safekeeping: str | None = None) -> None:
    side = _el(parent, SESE023, path)
    _el(side, SESE023, "Dpstry/Id/AnyBIC", depository)
    pty1 = _el(side, SESE023, "Pty1")
    _el(pty1, SESE023, "Id/AnyBIC", agent)
    if safekeeping is not None:
        _el(pty1, SESE023, "SfkpgAcct/Id", safekeeping)


def amount_text(amount: Decimal, currency: str) -> str:
    """``amount`` written in the currency's minor units; one that is not whole in them is
    refused (ValueError), never rounded here: rounding is the obligation's business."""
    digits = minor_units(currency)
    if amount != amount.quantize(Decimal(1).scaleb(-digits)):
        raise ValueError(f"amount {currency} {amount} is not in minor units ({digits} "
                         "decimals)")
    return f"{amount:.{digits}f}"


def sese023(instr: Instruction, security: Security, participant: Participant,
            parties: Parties) -> Any:
    """The instruction's sese.023 ``Document`` (an lxml element)."""
    from lxml import etree

    doc = etree.Element(f"{{{SESE023}}}Document", nsmap={None: SESE023})
    tx = _el(doc, SESE023, "SctiesSttlmTxInstr")
    _el(tx, SESE023, "TxId", instr.instruction_id)
    kind = _el(tx, SESE023, "SttlmTpAndAddtlParams")
    _el(kind, SESE023, "SctiesMvmntTp", instr.side)
    _el(kind, SESE023, "Pmt", "FREE" if instr.payment == "NONE" else "APMT")
    for replaced in (x for x in instr.links.split(";") if x):
        # Information only: the instruction it replaces was cancelled (or settled in part).
        link = _el(tx, SESE023, "Lnkgs")
        _el(link, SESE023, "PrcgPos/Cd", "INFO")
        _el(link, SESE023, "Ref/SctiesSttlmTxId", replaced)
    trade = _el(tx, SESE023, "TradDtls")
    _el(trade, SESE023, "TradDt/Dt/Dt", instr.trade_date)
    _el(trade, SESE023, "SttlmDt/Dt/Dt", instr.settlement_date)
    _el(tx, SESE023, "FinInstrmId/ISIN", security.isin)
    qty = _el(tx, SESE023, "QtyAndAcctDtls")
    _el(qty, SESE023, "SttlmQty/Qty/Unit", str(instr.quantity))
    _el(qty, SESE023, "SfkpgAcct/Id", participant.safekeeping_account)
    _el(tx, SESE023, "SttlmParams/SctiesTxTp/Cd", "TRAD")
    own = (parties.depository_bic, participant.bic, participant.safekeeping_account)
    other = (parties.depository_bic, parties.counterparty_bic)
    delivering, receiving = (other, own) if instr.side == "RECE" else (own, other)
    _party(tx, "DlvrgSttlmPties", *delivering)
    _party(tx, "RcvgSttlmPties", *receiving)
    if instr.payment != "NONE":
        money = _el(tx, SESE023, "SttlmAmt")
        _el(money, SESE023, "Amt", amount_text(instr.amount, security.currency),
            Ccy=security.currency)
        # The account's view: it pays (DBIT) or is paid (CRDT).
        _el(money, SESE023, "CdtDbtInd", "DBIT" if instr.payment == "PAY" else "CRDT")
    return doc


def sese020(instr: Instruction, participant: Participant) -> Any:
    """A ``cancel`` line's sese.020 ``Document``: the cancellation of the instruction it
    links, named by that one's id, movement and payment type (its own id is the header's
    BizMsgIdr)."""
    from lxml import etree

    doc = etree.Element(f"{{{SESE020}}}Document", nsmap={None: SESE020})
    req = _el(doc, SESE020, "SctiesTxCxlReq")
    ref = _el(req, SESE020, "AcctOwnrTxId/SctiesSttlmTxId")
    _el(ref, SESE020, "TxId", instr.links)
    _el(ref, SESE020, "SctiesMvmntTp", instr.side)
    _el(ref, SESE020, "Pmt", "FREE" if instr.payment == "NONE" else "APMT")
    _el(req, SESE020, "SfkpgAcct/Id", participant.safekeeping_account)
    return doc


def app_header(instr: Instruction, parties: Parties, created: dt.datetime) -> Any:
    """The head.001 Business Application Header of the line's message (sese.023, or sese.020
    for a cancellation)."""
    from lxml import etree

    hdr = etree.Element(f"{{{HEAD001}}}AppHdr", nsmap={None: HEAD001})
    _el(hdr, HEAD001, "Fr/FIId/FinInstnId/BICFI", parties.sender_bic)
    _el(hdr, HEAD001, "To/FIId/FinInstnId/BICFI", parties.receiver_bic)
    _el(hdr, HEAD001, "BizMsgIdr", instr.instruction_id)
    _el(hdr, HEAD001, "MsgDefIdr",
        "sese.020.001.07" if instr.kind == "cancel" else "sese.023.001.11")
    _el(hdr, HEAD001, "CreDt", created.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return hdr


def rule_problems(instr: Instruction, security: Security, parties: Parties,
                  document: Any | None = None) -> list[str]:
    """What the market rules refuse in an instruction (or in its ``document``, when given)
    that the schema lets through."""
    problems: list[str] = []
    if instr.quantity <= 0:
        problems.append(f"{instr.instruction_id}: quantity {instr.quantity}: a cash-only "
                        "obligation is not a securities settlement instruction")
    digits = minor_units(security.currency)
    if instr.amount != instr.amount.quantize(Decimal(1).scaleb(-digits)):
        problems.append(f"{instr.instruction_id}: amount {security.currency} {instr.amount} "
                        f"is not in minor units ({digits} decimals)")
    if document is not None:
        side = "DlvrgSttlmPties" if instr.side == "RECE" else "RcvgSttlmPties"
        ns = f"{{{SESE023}}}"
        found = document.find(f".//{ns}{side}")
        for what, path in (("depository", f"{ns}Dpstry/{ns}Id/{ns}AnyBIC"),
                           ("agent (Pty1)", f"{ns}Pty1/{ns}Id/{ns}AnyBIC")):
            if found is None or found.find(path) is None:
                problems.append(f"{instr.instruction_id}: the counterparty's settlement "
                                f"parties ({side}) lack the {what} by BIC")
    return problems


@cache
def schema(namespace: str) -> Any:
    """The official schema of a message (lxml), by its namespace."""
    from lxml import etree

    return etree.XMLSchema(etree.parse(str(OFFICIAL / _NAMESPACE_FILE[namespace])))


def schema_problems(element: Any) -> list[str]:
    """The official schema's complaints about ``element`` (a Document or an AppHdr)."""
    from lxml import etree

    namespace = etree.QName(element).namespace
    checker = schema(namespace)
    if checker.validate(element):
        return []
    return [f"line {e.line}: {e.message}" for e in checker.error_log]


@dataclass(frozen=True)
class Held:
    """A line not sent, and why."""

    instruction_id: str
    kind: str
    account: str
    symbol: str
    reason: str


def held_reason(instr: Instruction, securities: Mapping[str, Security],
                participants: Mapping[str, Participant]) -> str | None:
    """Why a line cannot go out as a message (None: it can)."""
    if instr.quantity == 0:
        return ("cash only: no securities move, so no sese.023; settle it by payment"
                if instr.kind == "instruct" else
                "cancels a cash-only line, which was never sent as a sese.023")
    if instr.symbol not in securities:
        return (f"symbol {instr.symbol} has no ISIN in the reference data (settle refdata "
                "load --securities)")
    if instr.account not in participants:
        return (f"account {instr.account} has no participant in the reference data (settle "
                "refdata load --participants)")
    return None


def held_csv(held: list[Held]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(("instruction_id", "kind", "account", "symbol", "reason"))
    w.writerows((h.instruction_id, h.kind, h.account, h.symbol, h.reason) for h in held)
    return out.getvalue()


def messages(day: InstructionSet, securities: Mapping[str, Security],
             participants: Mapping[str, Participant], parties: Parties,
             currency: str) -> tuple[str, list[Held]]:
    """A custodian-mode set as one file of messages, and the lines held back. Every header
    and document is checked against its official schema and the code-checked rules first:
    a file with one problem is refused (ValueError naming it), never written."""
    from lxml import etree

    # A version that changed nothing has no lines, so no creation time, and no messages.
    assert day.created is not None or not day.lines, "a custodian set has its creation time"
    root = etree.Element(f"{{{ENVELOPE}}}Msgs", nsmap={None: ENVELOPE}, tradeDate=day.trade_date,
                         settlementDate=day.settlement_date, runId=str(day.run_id),
                         version=str(day.version))
    held: list[Held] = []
    problems: list[str] = []
    for instr in day.lines:
        why = held_reason(instr, securities, participants)
        if why is not None:
            held.append(Held(instr.instruction_id, instr.kind, instr.account, instr.symbol, why))
            continue
        participant = participants[instr.account]
        if instr.kind == "cancel":
            doc = sese020(instr, participant)
        else:
            # The amounts are the settlement currency's, whatever the security trades in.
            security = replace(securities[instr.symbol], currency=currency)
            doc = sese023(instr, security, participant, parties)
            problems += rule_problems(instr, security, parties, doc)
        header = app_header(instr, parties, day.created)
        problems += [f"{instr.instruction_id}: {p}" for p in
                     schema_problems(header) + schema_problems(doc)]
        msg = etree.SubElement(root, f"{{{ENVELOPE}}}Msg")
        msg.extend([header, doc])
    if problems:
        raise ValueError(f"the custodian messages of {day.trade_date} run {day.run_id} break "
                         f"{len(problems)} rule(s), nothing written: " + "; ".join(problems[:5]))
    return etree.tostring(root, xml_declaration=True, encoding="utf-8",
                          pretty_print=True).decode("utf-8"), held
