"""ccp mode (issue 59): fails stay open positions against the clearing house, carried into
the next settlement date marked to that day's closing prices, the marks in each member's
money line, the money lines closing to zero with the clearing house's; an answer that comes
after the next date's set was written still reaches that date. On the real PostgreSQL,
through the `settle instructions` commands, checked against a computation of the test's own."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from settlement.instructions.calendar import SettlementCalendar
from settlement.instructions.model import Net
from tests.test_instructions import _answer, _csv, _publish, _settle

SIGN_Q = {"RECE": 1, "DELI": -1, "NONE": 0}
SIGN_A = {"RECV": 1, "PAY": -1, "NONE": 0}
MEMBERS = {"A1": "P1", "A2": "P1", "A3": "P2"}  # the others clear as themselves


def _signed(row: dict[str, str]) -> Net:
    return Net(int(row["quantity"]) * SIGN_Q[row["side"]],
               Decimal(row["amount"]) * SIGN_A[row["payment"]])


@pytest.mark.services
def test_fails_are_carried_marked_to_the_close_and_the_money_lines_sum_to_zero(
        isolated: Any, tmp_path: Path) -> None:
    env = isolated.env
    parts = tmp_path / "participants.csv"
    parts.write_text("account,participant_id,bic,safekeeping_account\n"
                     "A1,P1,CHASUS33XXX,SAFE-1\nA2,P1,CHASUS33XXX,SAFE-2\n"
                     "A3,P2,CITIUS33XXX,SAFE-3\n")
    _settle(["refdata", "load", "--participants", str(parts)], env)

    # Monday 2026-11-23 settles Tuesday 2026-11-24.
    monday = {("A1", "AAPL"): Net(100, Decimal("-1500.0000")),   # A1 buys 100 AAPL at 15
              ("A2", "AAPL"): Net(-100, Decimal("1500.0000")),
              ("A3", "MSFT"): Net(30, Decimal("-900.3000")),     # A3 buys 30 MSFT at 30.01
              ("A1", "MSFT"): Net(-30, Decimal("900.3000")),
              ("A4", "IBM"): Net(10, Decimal("-500.0000")),      # A4 buys 10 IBM at 50
              ("A5", "IBM"): Net(-10, Decimal("500.0000"))}
    _publish(isolated, "2026-11-23", monday, {"AAPL": Decimal("15.1000"),
                                              "MSFT": Decimal("30.0000"),
                                              "IBM": Decimal("51.0000")})
    mon = {(r["account"], r["symbol"]): r for r in _csv(
        _settle(["instructions", "--date", "2026-11-23"], env)["path"])}
    iid = {k: r["instruction_id"] for k, r in mon.items()}
    # Three fails: A1's receipt of AAPL (its deliverer A2 settled: the clearing house stood
    # in), A1's delivery of MSFT and 6 of A5's 10 IBM. A4's answer is late (below).
    answers = _answer(tmp_path, "mon.csv", [
        (iid[("A1", "AAPL")], "failed", ""), (iid[("A2", "AAPL")], "settled", ""),
        (iid[("A1", "MSFT")], "failed", ""), (iid[("A3", "MSFT")], "settled", ""),
        (iid[("A5", "IBM")], "settled", "4")])
    got = _settle(["instructions", "status", "--file", str(answers)], env)
    assert (got["failed"], got["partial"], got["settled"], got["carried_late"]) == (
        2, 1, 2, [])

    # Tuesday 2026-11-24 settles Wednesday 2026-11-25; IBM does not trade Tuesday.
    closes = {"AAPL": Decimal("16.2500"), "MSFT": Decimal("29.5000")}
    tuesday = {("A1", "AAPL"): Net(20, Decimal("-320.0000")),    # A1 buys 20 from A6 at 16
               ("A2", "AAPL"): Net(-5, Decimal("81.2500")),      # A2 sells 5 to A6 at 16.25
               ("A6", "AAPL"): Net(-15, Decimal("238.7500"))}
    tue_run = _publish(isolated, "2026-11-24", tuesday, closes)
    tue = _settle(["instructions", "--date", "2026-11-24"], env)
    assert sorted(tue["carried_in"]) == sorted(
        [iid[("A1", "AAPL")], iid[("A1", "MSFT")], iid[("A5", "IBM")]])

    # A4's answer comes now, after Tuesday's set was written: it goes into that set at once.
    late = _answer(tmp_path, "late.csv", [(iid[("A4", "IBM")], "failed", "")])
    got = _settle(["instructions", "status", "--file", str(late)], env)
    assert [(x["run_id"], x["settlement_date"], x["fails"]) for x in got["carried_late"]] == [
        (tue_run, "2026-11-25", [iid[("A4", "IBM")]])]
    late_ids = got["carried_late"][0]["lines"]
    assert late_ids == [f"R{tue_run}-L000001"]
    # Imported again, the same answer changes nothing and carries nothing twice.
    again = _settle(["instructions", "status", "--file", str(late)], env)
    assert (again["unchanged"], again["carried_late"]) == (1, [])

    # The test's own computation. Open positions, each with the value it was carried with:
    # the contract, or for a partial its unsettled part pro rata (6 of 10 IBM: 300.00).
    opened = {("A1", "AAPL"): Net(100, Decimal("-1500.0000")),
              ("A1", "MSFT"): Net(-30, Decimal("900.3000")),
              ("A5", "IBM"): Net(-6, Decimal("300.0000")),
              ("A4", "IBM"): Net(10, Decimal("-500.0000"))}
    # Marked to Tuesday's closes; IBM at Monday's, the last published before Tuesday.
    price = {**closes, "IBM": Decimal("51.0000")}
    want_lines: dict[tuple[str, str], Net] = dict(tuesday)
    for (account, symbol), pos in opened.items():
        q, a = want_lines.get((account, symbol), Net(0, Decimal(0)))
        want_lines[(account, symbol)] = Net(q + pos.quantity,
                                            a - pos.quantity * price[symbol])
    rows = _csv(_settle(["instructions", "--date", "2026-11-24"], env)["path"])
    assert {(r["account"], r["symbol"]): _signed(r) for r in rows} == want_lines
    assert {r["instruction_id"] for r in rows} >= set(late_ids)  # the file has the late line
    # Each member's money line pays, lines and marks together, what its contracts did: the
    # day's cash and the carried positions' own values; the clearing house pays the rest.
    member_cash: dict[str, Decimal] = {}
    for (account, _), net in [*tuesday.items(), *opened.items()]:
        member = MEMBERS.get(account, account)
        member_cash[member] = member_cash.get(member, Decimal(0)) + net.amount
    want_money = {m: v.quantize(Decimal("0.01")) for m, v in member_cash.items()}
    want_money["clearing house"] = -sum(member_cash.values(), Decimal(0))
    summ = _settle(["instructions", "--date", "2026-11-24", "--summary"], env)
    money = {m["member"]: Decimal(m["money_line"]) for m in summ["members"]}
    assert money == want_money
    assert sum(money.values()) == Decimal(summ["money_rounding_residual"]) == 0
    # The clearing house takes back the 1500 it paid A2 for the AAPL A1 failed to take, pays
    # A1 the 900.30 A3 paid for the MSFT A1 failed to deliver, pays A5 the 300 for the rest
    # of its IBM and takes A4's 500 for the IBM it failed to take.
    assert money["clearing house"] == Decimal("799.70")
    # One obligation per member and instrument against the clearing house: P1's AAPL nets
    # A1's 120 in and A2's 5 out.
    owed = {(r["member"], r["symbol"]): (_signed(r), r["accounts"])
            for r in _csv(summ["obligations_path"])}
    want_owed: dict[tuple[str, str], Net] = {}
    for (account, symbol), net in want_lines.items():
        key = (MEMBERS.get(account, account), symbol)
        q, a = want_owed.get(key, Net(0, Decimal(0)))
        want_owed[key] = Net(q + net.quantity, a + net.amount)
    assert {k: v[0] for k, v in owed.items()} == want_owed
    assert owed[("P1", "AAPL")] == (Net(115, Decimal("-1863.7500")), "2")
    marks = {m["member"]: Decimal(m["marks"]) for m in summ["members"]}
    # AAPL rose 1.25 on 100 to receive: P1 is paid 125 and pays 1625 DVP; MSFT fell 0.51 on
    # 30 to deliver: 15.30 to P1; IBM rose 1 on 6 to deliver (A5 pays 6) and on 10 to
    # receive (A4 is paid 10).
    assert (marks["P1"], marks["A5"], marks["A4"], marks["A6"]) == (
        Decimal("140.3000"), Decimal("-6.0000"), Decimal("10.0000"), Decimal(0))
    # Every open position keeps its first settlement date and its age.
    by_member = {m["member"]: m for m in summ["members"]}
    assert (by_member["P1"]["fails_carried_in"], by_member["P1"]["oldest_fail_settlement_date"],
            by_member["P1"]["oldest_fail_age_days"]) == ("2", "2026-11-24", "1")

    # Wednesday: A1's combined AAPL line fails again. Carried into Friday 2026-11-27 (after
    # Thanksgiving), marked to Wednesday's close; it was first due Tuesday.
    tue_ids = {(r["account"], r["symbol"]): r["instruction_id"] for r in rows}
    _settle(["instructions", "status", "--file", str(_answer(tmp_path, "tue.csv", [
        (tue_ids[("A1", "AAPL")], "failed", ""), (tue_ids[("A6", "AAPL")], "settled", ""),
        (tue_ids[("A1", "MSFT")], "settled", ""), (tue_ids[("A5", "IBM")], "settled", ""),
        (late_ids[0], "settled", "")]))], env)
    _publish(isolated, "2026-11-25", {}, {"AAPL": Decimal("14.0000")})
    wed = _settle(["instructions", "--date", "2026-11-25", "--summary"], env)
    assert wed["settlement_date"] == "2026-11-27" and wed["carried_in"] == [
        tue_ids[("A1", "AAPL")]]
    p1 = {m["member"]: m for m in wed["members"]}["P1"]
    carried_with = want_lines[("A1", "AAPL")].amount  # 120 at Tuesday's market value
    at_market = -120 * Decimal("14.0000")
    assert (Decimal(p1["marks"]), Decimal(p1["net_money"])) == (carried_with - at_market,
                                                                at_market)
    cal = SettlementCalendar.from_settings(isolated.settings)
    import datetime as dt

    age = cal.days_between(dt.date(2026, 11, 24), dt.date(2026, 11, 27))
    assert age == 2  # the 25th and the 27th: Thanksgiving is no settlement day
    assert (p1["oldest_fail_settlement_date"], p1["oldest_fail_age_days"]) == (
        "2026-11-24", str(age))
