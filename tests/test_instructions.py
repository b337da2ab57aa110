"""Settlement instructions (issue 43): the settlement calendar, the lines a published day
yields, the ISO 20022 file against its schema, and fails carried forward on the real
PostgreSQL through the `settle instructions` commands."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from settlement.config import ConfigError, Settings, load_settings
from settlement.instructions.calendar import settlement_date, us_bank_holidays
from settlement.instructions.files import check_iso20022, to_csv, to_iso20022
from settlement.instructions.model import CarriedFail, Instruction, Net, build, unsettled_part
from settlement.instructions.store import InstructionSet
from tests.helpers import ROOT

# -- the settlement calendar (XNYS, US bank holidays) -----------------------------------------


@pytest.mark.parametrize(("trade", "settles", "cycle"), [
    ("2026-11-25", "2026-11-27", "T+1"),  # the day before Thanksgiving settles the Friday
    ("2026-11-27", "2026-11-30", "T+1"),  # a Friday settles the Monday
    ("2026-10-09", "2026-10-13", "T+1"),  # Columbus Day: the exchange trades, banks do not
    ("2026-10-12", "2026-10-13", "T+1"),  # a trade on Columbus Day itself
    ("2026-11-10", "2026-11-12", "T+1"),  # Veterans Day (a Wednesday in 2026)
    ("2026-12-31", "2027-01-04", "T+1"),  # New Year's Day and a weekend
    ("2026-11-25", "2026-11-30", "T+2"),
    ("2026-11-24", "2026-11-27", "T+2"),
    ("2026-11-28", "2026-11-30", "T+0"),  # a Saturday: the next settlement day
])
def test_settlement_dates_on_the_settlement_calendar(trade: str, settles: str,
                                                     cycle: str) -> None:
    assert settlement_date(Settings(settlement_cycle=cycle), trade).isoformat() == settles


def test_us_bank_holidays_follow_the_federal_reserve() -> None:
    # Veterans Day on a Sunday is observed on the Monday; on a Saturday it is not observed.
    assert us_bank_holidays(2029) == {dt.date(2029, 10, 8), dt.date(2029, 11, 12)}
    assert us_bank_holidays(2028) == {dt.date(2028, 10, 9)}
    # Without the bank holidays, Columbus Day settles like any session.
    assert settlement_date(Settings(settlement_holidays="none"), "2026-10-09") == \
        dt.date(2026, 10, 12)
    extra = Settings(settlement_holidays="us-banks,2026-11-27")
    assert settlement_date(extra, "2026-11-25") == dt.date(2026, 11, 30)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("SETTLE_SETTLEMENT_CYCLE", "T+7", "T+N with N from 0 to 5"),
    ("SETTLE_SETTLEMENT_CYCLE", "2", "T+N with N from 0 to 5"),
    ("SETTLE_SETTLEMENT_HOLIDAYS", "us-banks,2026-13-01", "neither 'us-banks'"),
    ("SETTLE_SETTLEMENT_CURRENCY", "usd", "ISO 4217"),
])
def test_a_bad_settlement_setting_names_itself_and_the_fix(
        name: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name) as err:
        load_settings()
    assert says in str(err.value)


# -- the lines of a day ----------------------------------------------------------------------

NETS = {("ACC1", "AAPL"): Net(100, Decimal("-1500.2500")),   # bought: receives, pays
        ("ACC2", "AAPL"): Net(-100, Decimal("1500.2500")),   # sold: delivers, is paid
        ("ACC1", "MSFT"): Net(0, Decimal("12.5000")),        # flat, a cash difference
        ("ACC2", "MSFT"): Net(0, Decimal("-12.5000")),
        ("ACC3", "IBM"): Net(0, Decimal(0))}                  # nothing to settle


def _signed(lines: list[Instruction]) -> dict[tuple[str, str], Net]:
    return {(x.account, x.symbol): Net(x.signed_quantity, x.signed_amount) for x in lines}


def test_a_day_yields_one_line_per_non_zero_net_with_dvp_signs() -> None:
    lines = build(7, 1, "2026-11-25", "2026-11-27", NETS, [])
    assert _signed(lines) == {k: v for k, v in NETS.items() if v != Net(0, Decimal(0))}
    by = {(x.account, x.symbol): x for x in lines}
    assert by[("ACC1", "AAPL")][5:9] == ("RECE", 100, "PAY", Decimal("1500.2500"))
    assert by[("ACC2", "AAPL")][5:9] == ("DELI", 100, "RECV", Decimal("1500.2500"))
    assert by[("ACC1", "MSFT")][5:9] == ("NONE", 0, "RECV", Decimal("12.5000"))  # cash only
    # Stable: the same run gives the same ids, in (account, symbol) order.
    assert [x.instruction_id for x in lines] == ["R7-000001", "R7-000002", "R7-000003",
                                                 "R7-000004"]
    assert build(7, 1, "2026-11-25", "2026-11-27", dict(reversed(NETS.items())), []) == lines


def test_fails_carried_in_sum_with_the_days_net() -> None:
    fails = [CarriedFail("R3-000001", "ACC1", "AAPL", 40, Decimal("-600.0000")),
             CarriedFail("R3-000009", "ACC1", "AAPL", 10, Decimal("-150.0000")),
             CarriedFail("R3-000002", "ACC9", "TSLA", -5, Decimal("90.0000"))]
    lines = build(8, 1, "2026-11-27", "2026-11-30", NETS, fails)
    by = {(x.account, x.symbol): x for x in lines}
    assert _signed(lines)[("ACC1", "AAPL")] == Net(150, Decimal("-2250.2500"))
    assert by[("ACC1", "AAPL")].carried_from == "R3-000001;R3-000009"
    assert by[("ACC9", "TSLA")][5:11] == ("DELI", 5, "RECV", Decimal("90.0000"), 1,
                                          "R3-000002")
    # A fail today's opposite net cancels leaves no line.
    cancel = [CarriedFail("R3-000004", "ACC2", "AAPL", 100, Decimal("-1500.2500"))]
    assert ("ACC2", "AAPL") not in _signed(build(8, 1, "d", "s", NETS, cancel))


def test_the_member_summary_sums_each_members_accounts_and_ages_its_fails() -> None:
    from settlement.instructions.summary import CLEARING_HOUSE, CarriedIn, money_lines, summarize

    def line(n: int, account: str, side: str, qty: int, pay: str, amount: str) -> Instruction:
        return Instruction(f"R9-{n:06d}", "2026-11-27", "2026-11-30", account, "AAPL", side,
                           qty, pay, Decimal(amount), 1, "")

    lines = [line(1, "A1", "RECE", 10, "PAY", "100.0000"),
             line(2, "A2", "DELI", 4, "RECV", "40.5000"),
             line(3, "A3", "NONE", 0, "RECV", "0.0001")]
    carried = [CarriedIn("R1-000001", "A2", dt.date(2026, 11, 20), 5),
               CarriedIn("R2-000001", "A1", dt.date(2026, 11, 25), 2)]
    marks = {"A1": Decimal("-3.2500"), "A3": Decimal("0.0040")}
    a3, p1 = summarize(lines, {"A1": "P1", "A2": "P1"}, carried, marks)  # in member order
    assert (p1.member, p1.mapped, sorted(p1.accounts), p1.instructions) == (
        "P1", True, ["A1", "A2"], 2)
    assert (p1.securities_in, p1.securities_out, p1.money_in, p1.money_out, p1.net_money) == (
        10, 4, Decimal("40.5000"), Decimal("100.0000"), Decimal("-59.5000"))
    assert (p1.fails_carried_in, p1.oldest_fail, p1.oldest_age_days) == (
        2, dt.date(2026, 11, 20), 5)
    assert (a3.member, a3.mapped, a3.money_in, a3.oldest_age_days) == (
        "A3", False, Decimal("0.0001"), None)
    # One money figure per member in cents, and the clearing house's closing the date:
    # P1 -59.50 - 3.25 = -62.75; A3 0.0001 + 0.0040 = 0.0041 -> 0.00; the clearing house
    # takes the other side of the exact total, 62.7459 -> 62.75; the cents left over are
    # the rounding residual.
    out, residual = money_lines([a3, p1], 2, ccp=True)
    assert [(x.member, x.money_line) for x in out] == [
        ("A3", Decimal("0.00")), ("P1", Decimal("-62.75")),
        (CLEARING_HOUSE, Decimal("62.75"))]
    assert residual == Decimal("0.00")
    assert out[-1].as_dict()["mapped"] == "" and out[0].as_dict()["marks"] == "0.0040"
    # Custodian mode has no clearing house line; the residual is against the exact sum.
    again = summarize(lines, {}, [])
    _, residual = money_lines(again, 2, ccp=False)
    assert residual == Decimal("-59.50") - Decimal("-59.4999")  # rounded less exact


def test_an_open_position_is_carried_at_market_and_its_mark_keeps_the_contract() -> None:
    """A fail marked to a close: the line goes at quantity x close (the receiver pays), the
    mark is the difference from the value it was carried with, and line plus mark pay what
    the contract did; a cash-only fail or one with no known close keeps its value."""
    from settlement.instructions.model import marked

    buy = CarriedFail("R1-000001", "A1", "AAPL", 100, Decimal("-1500.0000"))  # bought at 15
    at_market, mark = marked(buy, Decimal("16.2500"))
    assert (at_market.quantity, at_market.amount, mark) == (
        100, Decimal("-1625.0000"), Decimal("125.0000"))  # pays 1625 DVP, 125 back as a mark
    assert at_market.amount + mark == buy.amount
    sell = CarriedFail("R1-000002", "A2", "AAPL", -100, Decimal("1500.0000"))
    at_market, mark = marked(sell, Decimal("16.2500"))
    assert (at_market.amount, mark) == (Decimal("1625.0000"), Decimal("-125.0000"))
    cash = CarriedFail("R1-000003", "A4", "IBM", 0, Decimal("5.0000"))
    assert marked(cash, Decimal("99")) == (cash, Decimal(0))
    assert marked(buy, None) == (buy, Decimal(0))


def test_a_partial_carries_the_exact_remainder() -> None:
    line = Instruction("R1-000001", "2026-11-25", "2026-11-27", "A", "X", "DELI", 3, "RECV",
                       Decimal("100.0000"), 1, "")
    rest = unsettled_part(line, 1)
    assert rest is not None and rest.quantity == -2
    assert rest.amount == Decimal("66.6667")  # 33.3333 paid with the one delivered
    assert Decimal("100.0000") - rest.amount == Decimal("33.3333")
    assert unsettled_part(line, 3) is None
    assert unsettled_part(line, None) == CarriedFail("R1-000001", "A", "X", -3,
                                                     Decimal("100.0000"))


# -- ISO 20022 --------------------------------------------------------------------------------

SESE = "{urn:iso:std:iso:20022:tech:xsd:sese.023.001.11}"


def _day(lines: list[Instruction]) -> InstructionSet:
    return InstructionSet("2026-11-25", "2026-11-27", 7, 1, lines)


def test_the_iso20022_file_holds_one_valid_instruction_per_csv_line() -> None:
    import xml.etree.ElementTree as ET

    from python_iso20022.sese.sese_023_001_11.models import Sese02300111
    from xsdata.formats.dataclass.parsers import XmlParser
    from xsdata.formats.dataclass.parsers.config import ParserConfig

    lines = build(7, 1, "2026-11-25", "2026-11-27", NETS,
                  [CarriedFail("R3-000001", "ACC1", "AAPL", 40, Decimal("-600.0000"))])
    text = to_iso20022(_day(lines), "USD")  # schema-checked inside
    csv_rows = list(csv.DictReader(io.StringIO(to_csv(lines))))
    docs = ET.fromstring(text).findall(f"{SESE}Document")
    assert len(docs) == len(csv_rows) == len(lines)
    # Parsed by the published schema's generated model, strictly (an unknown element fails).
    parser = XmlParser(config=ParserConfig(fail_on_unknown_properties=True,
                                           fail_on_unknown_attributes=True))
    for doc, row in zip(docs, csv_rows, strict=True):
        msg = parser.from_string(ET.tostring(doc, encoding="unicode"), Sese02300111)
        tx = msg.scties_sttlm_tx_instr
        assert tx.tx_id == row["instruction_id"]
        assert str(tx.trad_dtls.sttlm_dt.dt.dt) == row["settlement_date"] == "2026-11-27"
        assert tx.qty_and_acct_dtls.sfkpg_acct.id == row["account"]
        assert tx.qty_and_acct_dtls.sttlm_qty.qty.unit == Decimal(row["quantity"])
        assert tx.fin_instrm_id.othr_id[0].id == row["symbol"]
        movement = tx.sttlm_tp_and_addtl_params.scties_mvmnt_tp.value
        if row["side"] != "NONE":
            assert movement == row["side"]
        if row["payment"] == "NONE":
            assert tx.sttlm_amt is None
        else:
            assert tx.sttlm_amt.amt.value == Decimal(row["amount"])
            assert tx.sttlm_amt.cdt_dbt_ind.value == {"RECV": "CRDT", "PAY": "DBIT"}[
                row["payment"]]
    assert "CARRIED R3-000001" in text


def test_an_account_longer_than_iso20022_allows_keeps_its_whole_name() -> None:
    """The contract takes accounts of 64 characters (and any printable text); sese.023's
    account Id 35: a longer one is shortened stably, with the whole account in Nm."""
    import xml.etree.ElementTree as ET

    from python_iso20022.sese.sese_023_001_11.models import Sese02300111
    from xsdata.formats.dataclass.parsers import XmlParser

    from settlement.instructions.files import account_id

    long_a, long_b = "Ω-<fund>&\"quoted\"-" + "x" * 46, "Ω-<fund>&\"quoted\"-" + "y" * 46
    assert len(long_a) == 64
    nets = {(long_a, "AAPL"): Net(5, Decimal("-10.0000")),
            (long_b, "AAPL"): Net(-5, Decimal("10.0000"))}
    text = to_iso20022(_day(build(7, 1, "2026-11-25", "2026-11-27", nets, [])), "USD")
    accounts = []
    for doc in ET.fromstring(text).findall(f"{SESE}Document"):
        msg = XmlParser().from_string(ET.tostring(doc, encoding="unicode"), Sese02300111)
        acct = msg.scties_sttlm_tx_instr.qty_and_acct_dtls.sfkpg_acct
        assert len(acct.id) == 35 and acct.id == account_id(acct.nm)
        accounts.append(acct.nm)
    assert accounts == [long_a, long_b]
    assert account_id(long_a) != account_id(long_b) and account_id("A1") == "A1"


def _element_tree_documents(lines: list[Instruction], currency: str) -> list[str]:
    """The reference: each line's sese.023 Document built with ElementTree (the mapping of
    settlement.instructions.files), indented and serialized by it, one string apiece."""
    import xml.etree.ElementTree as ET

    from settlement.instructions.files import SESE as SESE_NS
    from settlement.instructions.files import account_id

    ET.register_namespace("sese", SESE_NS)
    root = ET.Element("SttlmInstrs")  # its own attributes are not compared

    def sub(parent: ET.Element, path: str, text: str | None = None, **attrs: str
            ) -> ET.Element:
        for name in path.split("/"):
            parent = ET.SubElement(parent, f"{{{SESE_NS}}}{name}")
        parent.attrib.update(attrs)
        parent.text = text
        return parent

    for x in lines:
        tx = sub(root, "Document/SctiesSttlmTxInstr")
        sub(tx, "TxId", x.instruction_id)
        params = sub(tx, "SttlmTpAndAddtlParams")
        sub(params, "SctiesMvmntTp", x.side if x.side != "NONE" else
            ("DELI" if x.payment == "RECV" else "RECE"))
        sub(params, "Pmt", "FREE" if x.payment == "NONE" else "APMT")
        trade = sub(tx, "TradDtls")
        for carried in (c for c in x.carried_from.split(";") if c):
            sub(trade, "TradId", f"CARRIED {carried}")
        sub(trade, "TradDt/Dt/Dt", x.trade_date)
        sub(trade, "SttlmDt/Dt/Dt", x.settlement_date)
        other = sub(tx, "FinInstrmId/OthrId")
        sub(other, "Id", x.symbol)
        sub(other, "Tp/Prtry", "TICKER")
        qty = sub(tx, "QtyAndAcctDtls")
        sub(qty, "SttlmQty/Qty/Unit", str(x.quantity))
        account = sub(qty, "SfkpgAcct")
        sub(account, "Id", account_id(x.account))
        if account_id(x.account) != x.account:
            sub(account, "Nm", x.account)
        sub(tx, "SttlmParams/SctiesTxTp/Cd", "NETT")
        if x.payment != "NONE":
            amount = sub(tx, "SttlmAmt")
            sub(amount, "Amt", f"{x.amount:.4f}", Ccy=currency)
            sub(amount, "CdtDbtInd", "CRDT" if x.payment == "RECV" else "DBIT")
    ET.indent(root, space="  ")
    text = ET.tostring(root, encoding="unicode")
    return text.split("\n", 1)[1].rsplit("\n", 1)[0].split("  <sese:Document>")[1:]


def test_the_iso20022_text_is_what_element_tree_writes() -> None:
    """The file's documents are written as text (a close's 12,000 cost 0.6 s as a tree):
    byte for byte what ElementTree gives for the same elements, whatever the line holds (a
    carried fail, a shortened account, characters to escape, a cash-only or free line)."""
    odd = "Ω-<fund>&\"quoted\"-" + "x" * 46
    nets = {**NETS, (odd, "A&B<c>"): Net(7, Decimal("-0.0001")),
            ("B" * 35, "A&B<c>"): Net(-7, Decimal("0.0001")),
            ("ACC4", "IBM"): Net(5, Decimal(0)), ("ACC5", "IBM"): Net(-5, Decimal(0))}
    lines = build(7, 1, "2026-11-25", "2026-11-27", nets,
                  [CarriedFail("R3-000001", "ACC1", "AAPL", 40, Decimal("-600.0000")),
                   CarriedFail("R3-000002", "ACC1", "AAPL", -40, Decimal("600.0000"))])
    assert {x.payment for x in lines} >= {"PAY", "RECV", "NONE"}
    assert {x.side for x in lines} >= {"DELI", "RECE", "NONE"}
    assert any(";" in x.carried_from for x in lines)
    ours = to_iso20022(_day(lines), "USD").split("  <sese:Document>")[1:]
    ours[-1] = ours[-1].removesuffix("</SttlmInstrs>\n")
    reference = _element_tree_documents(lines, "USD")
    assert len(ours) == len(lines) == len(reference)
    for mine, theirs in zip(ours, reference, strict=True):
        assert mine.rstrip("\n") == theirs.rstrip("\n")


def test_the_schema_check_refuses_what_sese023_does_not_allow() -> None:
    lines = build(7, 1, "2026-11-25", "2026-11-27", NETS, [])
    good = to_iso20022(_day(lines), "USD")
    for bad, why in ((good.replace("<sese:TxId>R7-000001", "<sese:TxId>" + "X" * 36), "TxId"),
                     (good.replace("NETT", "SWAP", 1), "Cd"),
                     (good.replace('Ccy="USD"', 'Ccy="usd"', 1), "Ccy"),
                     (good.replace("<sese:Pmt>APMT</sese:Pmt>", "", 1), "Pmt")):
        assert bad != good, why
        with pytest.raises(ValueError, match="fail their schema"):
            check_iso20022(bad)


# -- on the real PostgreSQL -------------------------------------------------------------------


def _publish(isolated: Any, trade_date: str, nets: dict[tuple[str, str], Net],
             closes: dict[str, Decimal] | None = None) -> int:
    """A published run holding ``nets`` as its positions and ``closes`` as its instruments'
    closing prices (the netting itself is tested elsewhere: here the day's published
    positions are the input)."""
    from settlement.close.pipeline import finish_run, publish, start_run
    from settlement.db import connect, q
    from settlement.eod.model import SourceChoice

    s = isolated.settings.for_component("settlement")
    run = start_run(s, trade_date, SourceChoice("db", "instructions test"))
    with connect(s.settlement_dsn) as conn:
        conn.execute(q("eod", "settlement_partitions"), {"trade_date": trade_date})
        for (account, symbol), net in nets.items():
            bought, sold = max(net.quantity, 0), max(-net.quantity, 0)
            buy, sell = max(-net.amount, Decimal(0)), max(net.amount, Decimal(0))
            conn.execute("insert into run_positions values (%s, %s, %s, %s, %s, %s, %s, %s,"
                         " %s, %s, 1)", (run, trade_date, account, symbol, bought, sold,
                                         net.quantity, buy, sell, net.amount))
        for symbol, close in (closes or {}).items():
            conn.execute("insert into run_instrument_summary (run_id, trade_date, symbol,"
                         " trades, volume, notional, vwap, low_price, high_price, close_price)"
                         " values (%s, %s, %s, 1, 1, %s, %s, %s, %s, %s)",
                         (run, trade_date, symbol, close, close, close, close, close))
        conn.commit()
    publish(s, run, trade_date, None)
    finish_run(s, run, "succeeded", {})
    return run


def _settle(args: list[str], env: dict[str, str], ok: bool = True) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "settlement.cli", *args, "--json"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (res.returncode == 0) == ok, res.stderr[-2000:] + res.stdout[-2000:]
    return {**json.loads(res.stdout.strip().splitlines()[-1]), "stdout": res.stdout,
            "stderr": res.stderr}


def _csv(path: str) -> list[dict[str, str]]:
    return list(csv.DictReader(open(path, encoding="utf-8")))


def _answer(tmp_path: Path, name: str, rows: list[tuple[str, ...]],
            header: str = "instruction_id,status,settled_quantity") -> Path:
    path = tmp_path / name
    path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows))
    return path


@pytest.mark.services
def test_a_runs_nets_are_read_from_its_month_alone(isolated: Any) -> None:
    """run_positions is partitioned by month and keyed by date first: the run's nets are
    read with its date, so one month is read, not a year of history; and a run asked for
    under another date is refused, not handed an empty set of nets."""
    import psycopg

    from settlement.db import connect, q
    from settlement.instructions.store import InstructionsError, for_run

    run = _publish(isolated, "2026-11-25", {("ACC1", "AAPL"): Net(10, Decimal("-1500"))})
    s = isolated.settings.for_component("settlement")
    with connect(s.settlement_dsn) as conn:
        months = [r[0] for r in conn.execute(
            "select c.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid"
            " where i.inhparent = 'run_positions'::regclass order by 1")]
        assert months == ["run_positions_202611", "run_positions_202612"]
        with psycopg.ClientCursor(conn) as cur:
            cur.execute("explain " + q("instructions", "run_nets"),
                        {"run_id": run, "trade_date": "2026-11-25"})
            plan = "\n".join(r[0] for r in cur.fetchall())
        assert "run_positions_202611" in plan and "run_positions_202612" not in plan, plan
        assert for_run(conn, s, "2026-11-25", run).lines  # its instructions, from its nets
        with pytest.raises(InstructionsError, match="settled 2026-11-25, not 2026-11-26"):
            for_run(conn, s, "2026-11-26", run)


@pytest.mark.services
def test_a_published_day_yields_its_instructions_and_fails_are_carried_forward(
        isolated: Any, tmp_path: Path) -> None:
    """Wednesday 2026-11-25 settles Friday 2026-11-27; three of its instructions fail and one
    settles in part; Friday's trades settle Monday 2026-11-30, and Friday's instructions
    carry the fails, summed with Friday's net for the same account and instrument."""
    env = {**isolated.env, "SETTLE_FAILS_ALERT_SHARE": "0.5"}
    wed = {("A1", "AAPL"): Net(100, Decimal("-1500.0000")),
           ("A2", "AAPL"): Net(-100, Decimal("1500.0000")),
           ("A1", "MSFT"): Net(-30, Decimal("900.3000")),
           ("A3", "MSFT"): Net(30, Decimal("-900.3000")),
           ("A4", "IBM"): Net(0, Decimal("5.0000")),
           ("A5", "IBM"): Net(0, Decimal("-5.0000"))}
    run = _publish(isolated, "2026-11-25", wed)
    out = _settle(["instructions", "--date", "2026-11-25"], env)
    assert {k: out[k] for k in ("trade_date", "settlement_date", "run_id", "version",
                                "instructions")} == {
        "trade_date": "2026-11-25", "settlement_date": "2026-11-27", "run_id": run,
        "version": 1, "instructions": 6}
    rows = _csv(out["path"])
    assert {(r["account"], r["symbol"]): Net(
        int(r["quantity"]) * {"RECE": 1, "DELI": -1, "NONE": 0}[r["side"]],
        Decimal(r["amount"]) * {"RECV": 1, "PAY": -1, "NONE": 0}[r["payment"]])
        for r in rows} == wed
    assert {r["settlement_date"] for r in rows} == {"2026-11-27"}
    again = _settle(["instructions", "--date", "2026-11-25"], env)
    assert _csv(again["path"]) == rows  # the same run, the same ids and lines
    iso = _settle(["instructions", "--date", "2026-11-25", "--format", "iso20022", "--out",
                   str(tmp_path / "wed.xml")], env)
    check_iso20022((tmp_path / "wed.xml").read_text())
    assert iso["path"] == str(tmp_path / "wed.xml")
    assert (tmp_path / "wed.xml").read_text().count("<sese:SctiesSttlmTxInstr>") == 6

    ids = {(r["account"], r["symbol"]): r["instruction_id"] for r in rows}
    answer = _answer(tmp_path, "wed-status.csv", [
        (ids[("A1", "AAPL")], "failed", ""), (ids[("A2", "AAPL")], "failed", ""),
        (ids[("A4", "IBM")], "failed", ""), (ids[("A1", "MSFT")], "settled", "10"),
        (ids[("A3", "MSFT")], "settled", ""), (ids[("A5", "IBM")], "settled", "")])
    status = _settle(["instructions", "status", "--file", str(answer)], env)
    assert (status["failed"], status["partial"], status["settled"]) == (3, 1, 2), status
    # 4 of 6 open: above the 0.5 share, an alert on the close's channels (the log here).
    assert status["over_threshold"][0]["open_fails"] == 4
    assert "ALERT [settlement] 2026-11-25: settlement FAILS above their threshold" in \
        status["stdout"]

    fri = {("A1", "AAPL"): Net(20, Decimal("-310.0000")),
           ("A2", "AAPL"): Net(-20, Decimal("310.0000")),
           ("A6", "TSLA"): Net(5, Decimal("-1000.0000")),
           ("A7", "TSLA"): Net(-5, Decimal("1000.0000"))}
    _publish(isolated, "2026-11-27", fri)
    later = _settle(["instructions", "--date", "2026-11-27"], env)
    assert later["settlement_date"] == "2026-11-30"
    assert sorted(later["carried_in"]) == sorted(
        [ids[("A1", "AAPL")], ids[("A2", "AAPL")], ids[("A4", "IBM")], ids[("A1", "MSFT")]])
    friday = {(r["account"], r["symbol"]): r for r in _csv(later["path"])}
    expected = {("A1", "AAPL"): Net(120, Decimal("-1810.0000")),   # 100 failed + 20 today
                ("A2", "AAPL"): Net(-120, Decimal("1810.0000")),
                ("A4", "IBM"): Net(0, Decimal("5.0000")),           # cash only, carried
                ("A1", "MSFT"): Net(-20, Decimal("600.2000")),      # 10 of 30 delivered
                ("A6", "TSLA"): Net(5, Decimal("-1000.0000")),
                ("A7", "TSLA"): Net(-5, Decimal("1000.0000"))}
    assert {k: Net(int(r["quantity"]) * {"RECE": 1, "DELI": -1, "NONE": 0}[r["side"]],
                   Decimal(r["amount"]) * {"RECV": 1, "PAY": -1, "NONE": 0}[r["payment"]])
            for k, r in friday.items()} == expected
    assert friday[("A1", "AAPL")]["carried_from"] == ids[("A1", "AAPL")]
    assert friday[("A6", "TSLA")]["carried_from"] == ""
    # The per-member summary (issue 59): A1 and A2 clear through P1, A6 through P2; the
    # others map to no participant and stand alone. Checked against the Friday file itself.
    parts = tmp_path / "participants.csv"
    parts.write_text("account,participant_id,bic,safekeeping_account\n"
                     "A1,P1,CHASUS33XXX,SAFE-1\nA2,P1,CHASUS33XXX,SAFE-2\n"
                     "A6,P2,CITIUS33XXX,SAFE-6\n")
    _settle(["refdata", "load", "--participants", str(parts)], env)
    summ = _settle(["instructions", "--date", "2026-11-27", "--summary"], env)
    member_of = {"A1": "P1", "A2": "P1", "A6": "P2"}
    want: dict[str, dict[str, Any]] = {}
    for r in friday.values():
        m = want.setdefault(member_of.get(r["account"], r["account"]), {
            "in": 0, "out": 0, "paid": Decimal(0), "pays": Decimal(0), "n": 0})
        m["n"] += 1
        m["in" if r["side"] == "RECE" else "out"] += int(r["quantity"]) * (r["side"] != "NONE")
        if r["payment"] != "NONE":
            m["paid" if r["payment"] == "RECV" else "pays"] += Decimal(r["amount"])
    got = {m["member"]: m for m in summ["members"]}
    assert set(got) == set(want) | {"clearing house"} == {"P1", "P2", "A4", "A7",
                                                           "clearing house"}
    for member, m in want.items():
        g = got[member]  # no closes published here: the fails keep their value, marks 0
        assert Decimal(g["marks"]) == 0 and Decimal(g["money_line"]) == Decimal(g["net_money"])
        assert (int(g["instructions"]), int(g["securities_in"]), int(g["securities_out"]),
                Decimal(g["money_in"]), Decimal(g["money_out"])) == (
            m["n"], m["in"], m["out"], m["paid"], m["pays"]), member
        assert Decimal(g["net_money"]) == m["paid"] - m["pays"]
    assert (got["P1"]["mapped"], got["A4"]["mapped"]) == ("yes", "no")
    # Fails carried in: three of P1's (A1 AAPL, A2 AAPL, A1 MSFT) and A4's cash-only one, all
    # first due Friday 2026-11-27, one settlement day before Monday's settlement date.
    assert [(got[m]["fails_carried_in"], got[m]["oldest_fail_settlement_date"],
             got[m]["oldest_fail_age_days"]) for m in ("P1", "A4", "P2")] == [
        ("3", "2026-11-27", "1"), ("1", "2026-11-27", "1"), ("0", "", "")]
    assert _csv(summ["path"])[0]["member"] == "A4"  # the file: one line per member, sorted
    # The report page in the UI shows the same summary, from the database.
    from settlement.orchestration.reports_app import _members

    assert _members(isolated.settings.settlement_dsn, later["run_id"]) == summ["members"]
    # Carried once: settling the Friday lines leaves no open fail.
    fri_answer = _answer(tmp_path, "fri-status.csv",
                         [(r["instruction_id"], "settled") for r in friday.values()],
                         header="instruction_id,status")
    assert _settle(["instructions", "status", "--file", str(fri_answer)], env)["settled"] == 6
    st = _settle(["status"], env, ok=False)  # unhealthy: no site runs here; the count is read
    assert st["settlement"]["open_fails"] == 0
    assert st["settlement"]["runs"][0]["settlement_date"] == "2026-11-30"


@pytest.mark.services
def test_a_bad_answer_is_refused_whole_and_names_its_lines(isolated: Any,
                                                           tmp_path: Path) -> None:
    from settlement.db import connect

    env = isolated.env
    day = {("A1", "AAPL"): Net(10, Decimal("-100.0000")),
           ("A2", "AAPL"): Net(-10, Decimal("100.0000"))}
    _publish(isolated, "2026-11-23", day)
    first = _settle(["instructions", "--date", "2026-11-23"], env)
    a1, a2 = (r["instruction_id"] for r in _csv(first["path"]))

    def refused(rows: list[tuple[str, ...]], says: str, header: str | None = None) -> None:
        path = _answer(tmp_path, "bad.csv", rows, *([header] if header else []))
        out = _settle(["instructions", "status", "--file", str(path)], env, ok=False)
        assert "nothing applied" in out["error"] or "header" in out["error"], out["error"]
        assert says in out["error"], out["error"]
        with connect(isolated.settings.settlement_dsn) as conn:
            assert conn.execute("select count(*) from instruction_statuses").fetchone() == (0,)

    refused([(a1, "failed", ""), ("R999-000001", "settled", "")],
            "unknown instruction R999-000001")
    refused([(a1, "lost", "")], "line 2: status 'lost'")
    refused([(a1, "settled", "11")], "exceeds the instruction's quantity 10")
    refused([(a1, "settled", "x")], "line 2: settled_quantity 'x'")
    refused([(a1, "failed", "3")], "a failed instruction settled nothing")
    refused([(a1, "failed", ""), (a1, "settled", "")], "line 3: " + a1 + " is answered twice")
    refused([(a1, "failed")], "header", header="id,state")
    # The day published again: the first run's instructions are superseded.
    _publish(isolated, "2026-11-23", day)
    refused([(a2, "failed", "")], "superseded")
    now = _settle(["instructions", "--date", "2026-11-23"], env)
    assert now["version"] == 2 and now["run_id"] != first["run_id"]
    fresh = _csv(now["path"])[0]["instruction_id"]
    ok = _settle(["instructions", "status", "--file",
                  str(_answer(tmp_path, "ok.csv", [(fresh, "failed", "")]))], env)
    assert ok["failed"] == 1
    # The same answer again changes nothing; a different one is refused.
    same = _settle(["instructions", "status", "--file",
                    str(_answer(tmp_path, "same.csv", [(fresh, "failed", "")]))], env)
    assert same["unchanged"] == 1 and same["failed"] == 0
    out = _settle(["instructions", "status", "--file",
                   str(_answer(tmp_path, "conflict.csv", [(fresh, "settled", "")]))], env,
                  ok=False)
    assert "already answered failed" in out["error"]
    missing = _settle(["instructions", "--date", "2026-11-24"], env, ok=False)
    assert "has no published run" in missing["error"]


@pytest.mark.services
def test_two_sites_writing_a_days_instructions_at_once_write_them_once(
        isolated: Any, tmp_path: Path) -> None:
    """Both sites' write_instructions tasks run after the same publication: one writes the
    lines and takes the open fails, the other reads the same lines; nothing twice."""
    from concurrent.futures import ThreadPoolExecutor

    from settlement.db import connect
    from settlement.instructions.store import instructions

    day = {(f"A{i}", "AAPL"): Net(i - 5, Decimal(5 - i) * Decimal("10.5")) for i in range(10)}
    _publish(isolated, "2026-11-23", day)
    lines = _settle(["instructions", "--date", "2026-11-23"], isolated.env)
    first = _csv(lines["path"])[0]["instruction_id"]
    _settle(["instructions", "status", "--file",
             str(_answer(tmp_path, "a.csv", [(first, "failed", "")]))], isolated.env)
    _publish(isolated, "2026-11-24", day)
    s = isolated.settings
    with ThreadPoolExecutor(4) as pool:
        sets = list(pool.map(lambda _: instructions(s, "2026-11-24"), range(4)))
    assert all(x.lines == sets[0].lines for x in sets)
    assert [x.carried_in for x in sets] == [[first]] * 4
    with connect(s.settlement_dsn) as conn:
        n, carried = conn.execute(
            "select count(*), count(*) filter (where carried_from <> '')"
            " from settlement_instructions where trade_date = '2026-11-24'").fetchone()
    assert (n, carried) == (len(sets[0].lines), 1)


@pytest.mark.services
def test_a_fail_is_carried_day_after_day_until_it_settles(isolated: Any,
                                                          tmp_path: Path) -> None:
    """A fail carried into Tuesday fails again (in part) and is carried into Wednesday: the
    chain of carried_from leads back, and the open amount is always exact."""
    env = isolated.env
    nets = {("A1", "IBM"): Net(9, Decimal("-100.0000")),
            ("A2", "IBM"): Net(-9, Decimal("100.0000"))}
    _publish(isolated, "2026-11-23", nets)  # Monday, settles Tuesday
    mon = {r["account"]: r for r in _csv(_settle(["instructions", "--date", "2026-11-23"],
                                                 env)["path"])}
    _settle(["instructions", "status", "--file", str(_answer(tmp_path, "mon.csv", [
        (mon["A1"]["instruction_id"], "failed", ""),
        (mon["A2"]["instruction_id"], "failed", "")]))], env)
    _publish(isolated, "2026-11-24", {})  # a quiet Tuesday: only the fails to settle
    tue = {r["account"]: r for r in _csv(_settle(["instructions", "--date", "2026-11-24"],
                                                 env)["path"])}
    assert (tue["A1"]["side"], tue["A1"]["quantity"], tue["A1"]["amount"]) == \
        ("RECE", "9", "100.0000")
    assert tue["A1"]["carried_from"] == mon["A1"]["instruction_id"]
    _settle(["instructions", "status", "--file", str(_answer(tmp_path, "tue.csv", [
        (tue["A1"]["instruction_id"], "settled", "3"),
        (tue["A2"]["instruction_id"], "settled", "")]))], env)
    _publish(isolated, "2026-11-25", {})
    wed = _csv(_settle(["instructions", "--date", "2026-11-25"], env)["path"])
    assert [(r["account"], r["side"], r["quantity"], r["payment"], r["amount"],
             r["carried_from"]) for r in wed] == [
        ("A1", "RECE", "6", "PAY", "66.6667", tue["A1"]["instruction_id"])]


@pytest.mark.services
def test_the_delta_between_two_versions_is_what_to_add_or_reverse(isolated: Any,
                                                                   tmp_path: Path) -> None:
    """A day published again (a rerun, a re-close) gets a new version; `--delta` lists only
    the accounts and instruments whose lines changed, by exactly the change."""
    env = isolated.env
    v1 = {("A1", "AAPL"): Net(100, Decimal("-1500.0000")),
          ("A2", "AAPL"): Net(-100, Decimal("1500.0000")),
          ("A3", "IBM"): Net(10, Decimal("-50.0000")),
          ("A4", "IBM"): Net(-10, Decimal("50.0000"))}
    _publish(isolated, "2026-11-23", v1)
    alone = _settle(["instructions", "--date", "2026-11-23", "--delta"], env, ok=False)
    assert "one version only" in alone["error"]
    sent = {(r["account"], r["symbol"]): r["instruction_id"] for r in _csv(
        _settle(["instructions", "--date", "2026-11-23"], env)["path"])}  # version 1 sent
    v2 = {("A1", "AAPL"): Net(60, Decimal("-900.0000")),      # 40 of A1's busted
          ("A2", "AAPL"): Net(-60, Decimal("900.0000")),
          ("A3", "IBM"): Net(10, Decimal("-50.0000")),        # unchanged
          ("A4", "IBM"): Net(-10, Decimal("50.0000")),
          ("A5", "TSLA"): Net(1, Decimal("-200.0000")),       # a correction moved a trade
          ("A6", "TSLA"): Net(-1, Decimal("200.0000"))}
    _publish(isolated, "2026-11-23", v2)
    # Version 1 is what the agent holds; until a delta says so, its ids are superseded.
    v1_answer = _answer(tmp_path, "v1.csv", [(sent[("A3", "IBM")], "failed", "")])
    refused = _settle(["instructions", "status", "--file", str(v1_answer)], env, ok=False)
    assert "superseded" in refused["error"] and "--delta" in refused["error"]
    out = _settle(["instructions", "--date", "2026-11-23", "--delta"], env)
    assert out["version"] == 2 and out["delta"] and out["path"].endswith("-delta.csv")
    rows = _csv(out["path"])
    change = {(r["account"], r["symbol"]): Net(
        int(r["quantity"]) * {"RECE": 1, "DELI": -1, "NONE": 0}[r["side"]],
        Decimal(r["amount"]) * {"RECV": 1, "PAY": -1, "NONE": 0}[r["payment"]]) for r in rows}
    assert change == {("A1", "AAPL"): Net(-40, Decimal("600.0000")),
                      ("A2", "AAPL"): Net(40, Decimal("-600.0000")),
                      ("A5", "TSLA"): Net(1, Decimal("-200.0000")),
                      ("A6", "TSLA"): Net(-1, Decimal("200.0000"))}
    assert all(r["instruction_id"].startswith(f"R{out['run_id']}-D") for r in rows)
    iso = _settle(["instructions", "--date", "2026-11-23", "--delta", "--format", "iso20022"],
                  env)
    check_iso20022(Path(iso["path"]).read_text())
    # The delta is stored: written again, the same ids and lines.
    assert _csv(_settle(["instructions", "--date", "2026-11-23", "--delta"], env)["path"]) \
        == rows
    # What was sent (version 1 and its delta) is answerable, and its fails are carried.
    delta_id = {(r["account"], r["symbol"]): r["instruction_id"] for r in rows}
    both = _answer(tmp_path, "both.csv", [(sent[("A3", "IBM")], "failed", ""),
                                          (delta_id[("A5", "TSLA")], "settled", ""),
                                          (delta_id[("A6", "TSLA")], "failed", "")])
    got = _settle(["instructions", "status", "--file", str(both)], env)
    assert (got["failed"], got["settled"]) == (2, 1)
    _publish(isolated, "2026-11-24", {})
    carried = _settle(["instructions", "--date", "2026-11-24"], env)
    assert sorted(carried["carried_in"]) == sorted([sent[("A3", "IBM")],
                                                    delta_id[("A6", "TSLA")]])
    # What was sent stays as it was: version 1's lines are still there, unchanged.
    from settlement.db import connect

    with connect(isolated.settings.settlement_dsn) as conn:
        assert conn.execute("select count(distinct run_id), count(*) from"
                            " settlement_instructions where trade_date = '2026-11-23'"
                            " and kind = 'instruct'").fetchone() == (2, 10)
    # Both versions stay readable, the earlier one as it was published.
    with connect(isolated.settings.for_component("auditor").settlement_dsn) as conn:
        by_version = {}
        for version, current, account, symbol, q, c in conn.execute(
                "select version, current, account, symbol, net_qty, net_cash"
                " from positions_by_version where trade_date = '2026-11-23'"):
            by_version.setdefault((version, current), {})[(account, symbol)] = Net(q, c)
    assert by_version == {(1, False): v1, (2, True): v2}
