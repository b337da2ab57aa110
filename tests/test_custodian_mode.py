"""Custodian mode (issue 59): a published day becomes sese.023 messages under head.001 headers
from the reference data, unmapped names and cash-only lines held; a failed instruction stays
pending and ages, never re-instructed; a re-close cancels (sese.020) what it changes and
instructs again, linked; every id ever sent stays answerable."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from settlement.instructions.custodian import (
    ENVELOPE,
    HEAD001,
    SESE020,
    SESE023,
    Parties,
    messages,
    schema_problems,
)
from settlement.instructions.model import Instruction, Net, in_minor_units, reinstruct
from settlement.instructions.refdata import Participant, Security
from settlement.instructions.store import InstructionSet
from tests.test_instructions import _answer, _csv, _publish, _settle

PARTIES = Parties("SETLUS33XXX", "CUSTUS33XXX", "DTCYUS33", "NSCCUS33")
SECS = {"AAPL": Security("AAPL", "US0378331005", "037833100", "USD"),
        "MSFT": Security("MSFT", "US5949181045", "594918104", "USD")}
PARTS = {a: Participant(a, f"P{n}", "PTYAUS33XXX" if n % 2 else "PTYBUS33", f"SFK-{a}")
         for n, a in enumerate(("A1", "A2", "A3", "A4"), start=1)}
NS = {"m": ENVELOPE, "h": HEAD001, "s23": SESE023, "s20": SESE020}


def _line(iid: str, account: str, symbol: str, qty: int, cash: str, **kw: Any) -> Instruction:
    side = "RECE" if qty > 0 else "DELI" if qty < 0 else "NONE"
    amount = Decimal(cash)
    pay = "RECV" if amount > 0 else "PAY" if amount < 0 else "NONE"
    return Instruction(iid, "2026-11-23", "2026-11-24", account, symbol, side, abs(qty), pay,
                       abs(amount), 1, "", **kw)


# -- the re-close's arithmetic ---------------------------------------------------------------


def test_a_reclose_cancels_what_changed_and_instructs_the_rest_linked() -> None:
    pending = _line("R1-000001", "A1", "AAPL", 100, "-1500.00")          # failed: all pending
    settled = _line("R1-000002", "A2", "AAPL", -100, "1500.00")          # settled whole
    partial = _line("R1-000003", "A3", "MSFT", 10, "-50.00")             # 4 of 10 settled
    same = _line("R1-000004", "A4", "MSFT", -10, "50.00")                # unchanged net
    gone = _line("R1-000005", "A5", "IBM", 3, "-30.00")                  # busted away
    live = [(pending, Net(100, Decimal("-1500.00"))), (settled, Net(0, Decimal(0))),
            (partial, Net(6, Decimal("-30.00"))), (same, Net(-10, Decimal("50.00"))),
            (gone, Net(3, Decimal("-30.00")))]
    nets = {("A1", "AAPL"): Net(60, Decimal("-900.00")),
            ("A2", "AAPL"): Net(-60, Decimal("900.00")),
            ("A3", "MSFT"): Net(8, Decimal("-40.00")),
            ("A4", "MSFT"): Net(-10, Decimal("50.00"))}
    out = reinstruct(2, 2, "2026-11-23", "2026-11-24", nets, live)
    cancels = {x.links: x for x in out if x.kind == "cancel"}
    new = {(x.account, x.symbol): x for x in out if x.kind == "instruct"}
    # What had something pending is cancelled; a settled instruction cannot be.
    assert sorted(cancels) == ["R1-000001", "R1-000003", "R1-000005"]
    assert cancels["R1-000001"][5:9] == ("RECE", 100, "PAY", Decimal("1500.00"))
    assert [x.instruction_id for x in out if x.kind == "cancel"] == [
        "R2-C000001", "R2-C000002", "R2-C000003"]
    # The new instruction is the net less what settled, linked to what it replaces.
    assert new[("A1", "AAPL")][5:9] == ("RECE", 60, "PAY", Decimal("900.00"))
    assert new[("A2", "AAPL")][5:9] == ("RECE", 40, "PAY", Decimal("600.00"))  # reverses 40
    assert new[("A3", "MSFT")][5:9] == ("RECE", 4, "PAY", Decimal("20.00"))    # 4 settled
    assert new[("A2", "AAPL")].links == "R1-000002"
    assert ("A4", "MSFT") not in new and "R1-000004" not in cancels  # unchanged: stands
    assert ("A5", "IBM") not in new
    # Nothing standing: the first version, whole.
    first = reinstruct(1, 1, "2026-11-23", "2026-11-24", nets, [])
    assert [(x.account, x.symbol, x.kind, x.links) for x in first] == [
        (a, s, "instruct", "") for a, s in sorted(nets)]


def test_amounts_go_to_minor_units_and_the_residual_is_reported() -> None:
    nets = {("A1", "AAPL"): Net(3, Decimal("-30.0050")),
            ("A2", "AAPL"): Net(-3, Decimal("30.0050")),
            ("A3", "MSFT"): Net(1, Decimal("-10.0151")),
            ("A4", "MSFT"): Net(-1, Decimal("10.0149"))}
    rounded, residual = in_minor_units(nets, 2)
    assert [rounded[k].amount for k in sorted(nets)] == [
        Decimal("-30.00"), Decimal("30.00"), Decimal("-10.02"), Decimal("10.01")]  # half-even
    assert residual == sum(r.amount for r in rounded.values()) - sum(
        n.amount for n in nets.values()) == Decimal("-0.0100") + Decimal("0.0002")


# -- the file of messages ----------------------------------------------------------------------


def _set(lines: list[Instruction]) -> InstructionSet:
    return InstructionSet("2026-11-23", "2026-11-24", 2, 2, lines, [], "custodian",
                          dt.datetime(2026, 11, 23, 22, 5, tzinfo=dt.UTC))


def _messages(text: str) -> list[tuple[Any, Any]]:
    root = etree.fromstring(text.encode())
    return [(m[0], m[1]) for m in root.findall("m:Msg", NS)]


def test_every_header_and_document_passes_its_official_schema_and_what_cannot_go_is_held(
        ) -> None:
    lines = [_line("R2-C000001", "A1", "AAPL", 100, "-1500.00", kind="cancel",
                   links="R1-000001"),
             _line("R2-000001", "A1", "AAPL", 60, "-900.00", links="R1-000001"),
             _line("R2-000002", "A2", "AAPL", -60, "900.00"),
             _line("R2-000003", "A3", "TSLA", 1, "-200.00"),     # no ISIN: held
             _line("R2-000004", "A9", "MSFT", 1, "-10.00"),      # no participant: held
             _line("R2-000005", "A3", "MSFT", 0, "5.00")]        # cash only: held
    text, held = messages(_set(lines), SECS, PARTS, PARTIES, "USD")
    assert [(h.instruction_id, h.reason.split(" ")[0]) for h in held] == [
        ("R2-000003", "symbol"), ("R2-000004", "account"), ("R2-000005", "cash")]
    sent = _messages(text)
    assert len(sent) == 3
    for header, doc in sent:
        assert schema_problems(header) == [] and schema_problems(doc) == []
    ids = [h.findtext("h:BizMsgIdr", namespaces=NS) for h, _ in sent]
    defs = [h.findtext("h:MsgDefIdr", namespaces=NS) for h, _ in sent]
    assert ids == ["R2-C000001", "R2-000001", "R2-000002"]
    assert defs == ["sese.020.001.07", "sese.023.001.11", "sese.023.001.11"]
    cancel = sent[0][1]
    assert cancel.findtext("s20:SctiesTxCxlReq/s20:AcctOwnrTxId/s20:SctiesSttlmTxId/s20:TxId",
                           namespaces=NS) == "R1-000001"
    replacement = sent[1][1].find("s23:SctiesSttlmTxInstr", NS)
    assert replacement.findtext("s23:Lnkgs/s23:Ref/s23:SctiesSttlmTxId",
                                namespaces=NS) == "R1-000001"
    assert replacement.findtext("s23:SttlmAmt/s23:Amt", namespaces=NS) == "900.00"
    # The same set renders the same bytes (the header's time is the set's).
    assert messages(_set(lines), SECS, PARTS, PARTIES, "USD")[0] == text


def test_a_version_that_changed_nothing_is_an_empty_file() -> None:
    empty = InstructionSet("2026-11-23", "2026-11-24", 3, 3, [], [], "custodian", None)
    text, held = messages(empty, SECS, PARTS, PARTIES, "USD")
    assert _messages(text) == [] and held == []
    assert etree.fromstring(text.encode()).get("version") == "3"


def test_a_line_an_agent_would_refuse_refuses_the_whole_file() -> None:
    odd = [_line("R2-000001", "A1", "AAPL", 60, "-900.1234")]  # USD has two decimals
    with pytest.raises(ValueError, match="minor units"):
        messages(_set(odd), SECS, PARTS, PARTIES, "USD")


# -- on the real PostgreSQL ----------------------------------------------------------------------


@pytest.fixture
def custodian(services: Any, tmp_path: Path) -> Any:
    import uuid

    from settlement.instructions.refdata import load
    from tests.conftest import namespace

    with namespace(services, f"t{uuid.uuid4().hex[:10]}",
                   {"SETTLE_INSTRUCTIONS_MODE": "custodian"}) as ns:
        secs = tmp_path / "securities.csv"
        secs.write_text("symbol,isin,cusip,currency\n" + "".join(
            f"{s.symbol},{s.isin},{s.cusip},{s.currency}\n" for s in SECS.values()))
        parts = tmp_path / "participants.csv"
        parts.write_text("account,participant_id,bic,safekeeping_account\n" + "".join(
            f"{p.account},{p.participant_id},{p.bic},{p.safekeeping_account}\n"
            for p in PARTS.values()))
        load(ns.settings, secs, parts)
        yield ns


def _sent(path: str) -> dict[str, tuple[str, Any]]:
    """The file's messages by their id: (message definition, document)."""
    out = {}
    for header, doc in _messages(Path(path).read_text()):
        assert schema_problems(header) == [] and schema_problems(doc) == []
        out[header.findtext("h:BizMsgIdr", namespaces=NS)] = (
            header.findtext("h:MsgDefIdr", namespaces=NS), doc)
    return out


@pytest.mark.services
def test_publish_send_reclose_and_answer_what_was_sent(custodian: Any, tmp_path: Path) -> None:
    """Monday 2026-11-23 settles Tuesday. Version 1 is sent; the agent fails one instruction
    and settles others, in part or whole; a re-close then changes three nets. Its file holds
    the cancellations and the linked replacements, and the answers to the ids first sent are
    all accepted. A fail stays pending (aged, with its close-out date), is never carried into
    Tuesday's trades, and settles later."""
    env, day = custodian.env, "2026-11-23"
    v1 = {("A1", "AAPL"): Net(100, Decimal("-1500.1250")),   # 1500.12 in minor units
          ("A2", "AAPL"): Net(-100, Decimal("1500.1250")),
          ("A3", "MSFT"): Net(10, Decimal("-50.0000")),
          ("A4", "MSFT"): Net(-10, Decimal("50.0000")),
          ("A1", "TSLA"): Net(1, Decimal("-200.0000")),      # no ISIN loaded: held
          ("A2", "TSLA"): Net(-1, Decimal("200.0000"))}
    run1 = _publish(custodian, day, v1)
    out = _settle(["instructions", "--date", day, "--format", "iso20022"], env)
    assert out["mode"] == "custodian" and out["cancellations"] == 0
    assert out["rounding_residual"] == "0.0000"  # -0.005 and +0.005, half-even both ways
    assert sorted(h["symbol"] for h in out["held"]) == ["TSLA", "TSLA"]
    assert Path(out["path"]).with_name(f"{day}-run{run1}-held.csv").exists()
    # What the close (and the DAG) finish after the publication: both files, the summary,
    # and the held lines, the same bytes as the command's.
    from settlement.instructions import write_files

    done = write_files(custodian.settings, day)
    assert Path(done["paths"]["iso20022"]).read_text() == Path(out["path"]).read_text()
    assert [h["instruction_id"] for h in done["held"]] == [h["instruction_id"]
                                                          for h in out["held"]]
    assert Path(done["summary_path"]).exists()
    # The audit-report pages serve the same messages, rendered from the database.
    from fastapi.testclient import TestClient

    from settlement.orchestration import reports_app

    dsn = custodian.settings.for_component("auditor").settlement_dsn
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reports_app, "settlement_dsn", lambda: dsn)
        reports_app.app.dependency_overrides[reports_app._authorized] = lambda: None
        try:
            page = TestClient(reports_app.app).get(f"/runs/{run1}/instructions.xml")
        finally:
            reports_app.app.dependency_overrides.clear()
    assert page.status_code == 200 and page.text == Path(out["path"]).read_text()
    first = _sent(out["path"])
    assert all(kind == "sese.023.001.11" for kind, _ in first.values()) and len(first) == 4
    rows = {(r["account"], r["symbol"]): r for r in _csv(
        _settle(["instructions", "--date", day], env)["path"])}
    assert rows[("A1", "AAPL")]["amount"] == "1500.1200" and rows[("A1", "AAPL")]["kind"] == \
        "instruct"
    a1, a2, a3, a4 = (rows[(a, s)]["instruction_id"] for a, s in (
        ("A1", "AAPL"), ("A2", "AAPL"), ("A3", "MSFT"), ("A4", "MSFT")))
    _settle(["instructions", "status", "--file", str(_answer(tmp_path, "v1.csv", [
        (a1, "failed", ""), (a2, "settled", ""), (a3, "settled", "4")]))], env)

    v2 = {**v1, ("A1", "AAPL"): Net(60, Decimal("-900.0000")),   # 40 busted
          ("A2", "AAPL"): Net(-60, Decimal("900.0000")),
          ("A4", "MSFT"): Net(-8, Decimal("40.0000")),
          ("A5", "MSFT"): Net(-2, Decimal("10.0000"))}           # no participant: held
    run2 = _publish(custodian, day, v2)
    out2 = _settle(["instructions", "--date", day, "--format", "iso20022"], env)
    assert out2["version"] == 2 and out2["cancellations"] == 2  # a1 and a4; a2 settled
    second = _sent(out2["path"])
    cancelled = {doc.findtext(".//s20:AcctOwnrTxId/s20:SctiesSttlmTxId/s20:TxId",
                              namespaces=NS) for kind, doc in second.values()
                 if kind == "sese.020.001.07"}
    assert cancelled == {a1, a4}
    links = {doc.findtext(".//s23:QtyAndAcctDtls/s23:SfkpgAcct/s23:Id", namespaces=NS):
             doc.findtext(".//s23:Lnkgs/s23:Ref/s23:SctiesSttlmTxId", namespaces=NS)
             for kind, doc in second.values() if kind == "sese.023.001.11"}
    assert links == {"SFK-A1": a1, "SFK-A2": a2, "SFK-A4": a4}
    assert [h["account"] for h in out2["held"]] == ["A5"]
    delta = _settle(["instructions", "--date", day, "--delta"], env, ok=False)
    assert "already the change" in delta["error"]  # a custodian re-close is its own delta

    # The agent answers the ids it was first sent, late, and the new ones: all recorded.
    new = {r["account"]: r["instruction_id"] for r in _csv(
        _settle(["instructions", "--date", day], env)["path"]) if r["kind"] == "instruct"}
    cancels = [i for i in second if i.startswith(f"R{run2}-C")]
    answers = _answer(tmp_path, "late.csv", [
        (a1, "settled", ""), (a4, "failed", ""), (new["A1"], "settled", ""),
        (new["A2"], "settled", ""), (new["A4"], "settled", ""),
        *((c, "settled", "") for c in cancels)])
    got = _settle(["instructions", "status", "--file", str(answers)], env)
    assert got["settled"] == 5 + len(cancels) - 1 and got["failed"] == 1
    assert got["after_cancellation"] == [{"instruction_id": a1,
                                          "cancellation": f"R{run2}-C000001"}]
    again = _settle(["instructions", "status", "--file", str(answers)], env)
    assert again["unchanged"] == 5 + len(cancels) and again["settled"] == 0

    # A3's rest (6 of 10) stays pending with the agent, aged; a cancelled fail does not.
    monday_settles = "2026-11-24"
    pend = _settle(["instructions", "pending", "--date", "2026-11-27"], env)
    assert [(p["instruction_id"], p["open_quantity"], p["intended_settlement_date"],
             p["age_days"], p["close_out_date"]) for p in pend["pending"]] == [
        (a3, 6, monday_settles, 2, "2026-12-01")]  # Thanksgiving is no settlement day
    from settlement.status import settlement_runs

    assert settlement_runs(custodian.settings)["open_fails"] == 1  # a4 failed, but cancelled
    # Tuesday's trades are instructed alone: nothing carried into them.
    _publish(custodian, "2026-11-24", {("A3", "MSFT"): Net(5, Decimal("-25.0000")),
                                       ("A4", "MSFT"): Net(-5, Decimal("25.0000"))})
    tue = _csv(_settle(["instructions", "--date", "2026-11-24"], env)["path"])
    assert [(r["account"], r["quantity"], r["carried_from"]) for r in tue] == [
        ("A3", "5", ""), ("A4", "5", "")]
    # The fail settles at last: answered again, it leaves the pending list; settled stays so.
    _settle(["instructions", "status", "--file", str(_answer(
        tmp_path, "later.csv", [(a3, "settled", "")]))], env)
    assert _settle(["instructions", "pending", "--date", "2026-11-27"], env)["pending"] == []
    refused = _settle(["instructions", "status", "--file", str(_answer(
        tmp_path, "undo.csv", [(a3, "failed", "")]))], env, ok=False)
    assert "already settled whole" in refused["error"]
    from settlement.db import connect

    with connect(custodian.settings.settlement_dsn) as conn:
        history = conn.execute("select status, settled_quantity from instruction_answers"
                               " where instruction_id = %s order by answer_id", (a3,)).fetchall()
    assert history == [("settled", 4), ("settled", None)]
