"""Reference data (issue 59): the files' checks, the simulator's example files, and a load
into the settlement database (all or nothing, idempotent)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from settlement.db import connect
from settlement.instructions.refdata import (
    RefDataError,
    check_participant,
    check_security,
    read_participants,
    read_securities,
)
from settlement.simulator.gateway import SimulationSpec, day_names
from tests.conftest import Isolated
from tests.helpers import ROOT, SETTLE, settle

SEC = "symbol,isin,cusip,currency\n"
PART = "account,participant_id,bic,safekeeping_account\n"


def test_a_good_security_and_participant_pass() -> None:
    assert check_security("AAPL", "US0378331005", "037833100", "USD") == []
    assert check_security("SAP", "DE0007164600", "", "EUR") == []
    assert check_participant("ACC0001", "DTC-0902", "DTCYUS33", "SFK-1") == []
    assert check_participant("ACC0002", "P1", "DEUTDEFF500", "x" * 35) == []


@pytest.mark.parametrize("isin, cusip, currency, why", [
    ("US0378331006", "", "USD", "ISIN 'US0378331006': the number's checksum"),
    ("US037833100", "", "USD", "ISIN 'US037833100': the number has an invalid length"),
    ("US0378331005", "037833101", "USD", "CUSIP '037833101': the number's checksum"),
    ("US0378331005", "594918104", "USD", "CUSIP '594918104' is not the one inside ISIN"),
    ("US0378331005", "", "USDX", "currency 'USDX' is not an ISO 4217 code"),
    ("US0378331005", "", "ABC", "currency 'ABC' is not an ISO 4217 code"),
])
def test_a_bad_security_is_named(isin: str, cusip: str, currency: str, why: str) -> None:
    assert any(p.startswith(why) for p in check_security("AAPL", isin, cusip, currency)), \
        check_security("AAPL", isin, cusip, currency)


@pytest.mark.parametrize("bic, safekeeping, why", [
    ("DTCYUS3", "S", "BIC 'DTCYUS3': the number has an invalid length"),
    ("DTCY1S33", "S", "BIC 'DTCY1S33'"),
    ("DTCYUS33", "", "safekeeping_account must be 1-35 characters"),
    ("DTCYUS33", "x" * 36, "safekeeping_account must be 1-35 characters"),
])
def test_a_bad_participant_is_named(bic: str, safekeeping: str, why: str) -> None:
    problems = check_participant("ACC1", "P1", bic, safekeeping)
    assert any(p.startswith(why) for p in problems), problems


def test_a_file_with_bad_lines_is_refused_whole_naming_each(tmp_path: Path) -> None:
    f = tmp_path / "securities.csv"
    f.write_text(SEC + "AAPL,US0378331005,037833100,USD\n"
                 "MSFT,US5949181045,,USDX\n"
                 "AAPL,US5949181045,,usd\n"
                 "X,Y\n")
    with pytest.raises(RefDataError) as e:
        read_securities(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: nothing loaded: ")
    for part in ("line 3: currency 'USDX'", "line 4: symbol AAPL is on line 2 too",
                 "line 4: ISIN US5949181045 is on line 3 too", "line 5: 2 fields, expected 4"):
        assert part in msg, msg
    f.write_text("ticker,isin\nAAPL,US0378331005\n")
    with pytest.raises(RefDataError, match="the header symbol,isin,cusip,currency"):
        read_securities(f)
    p = tmp_path / "participants.csv"
    p.write_text(PART + "ACC1,,DTCYUS33,S\nACC1,P,DTCYUS33,S\n")
    with pytest.raises(RefDataError, match="line 2: participant_id is empty.*line 3: "
                                           "account ACC1 is on line 2 too"):
        read_participants(p)


@pytest.mark.parametrize("hostile", [False, True])
def test_the_example_files_cover_the_simulators_names_and_pass_the_checks(
        tmp_path: Path, hostile: bool) -> None:
    args = ["refdata", "example", "--out", str(tmp_path), "--json"]
    res = subprocess.run([*SETTLE, *args, *(["--hostile-names"] if hostile else [])],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    symbols, accounts = day_names(SimulationSpec("2026-01-05", 1, hostile_names=hostile))
    secs = read_securities(tmp_path / "securities.csv")
    parts = read_participants(tmp_path / "participants.csv")
    # Exactly the simulator's names, hostile ones included, byte for byte.
    assert [s.symbol for s in secs] == symbols
    assert [p.account for p in parts] == accounts
    assert len({s.isin for s in secs}) == len(secs)


def test_load_needs_a_file_and_says_so() -> None:
    res = subprocess.run([*SETTLE, "refdata", "load"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "--securities FILE and/or --participants FILE" in res.stderr


@pytest.mark.services
def test_a_load_is_all_or_nothing_and_the_same_files_change_nothing(
        isolated: Isolated, tmp_path: Path) -> None:
    env = isolated.env
    ex = settle(["refdata", "example", "--out", str(tmp_path)], env)
    sec, part = Path(ex["securities_file"]), Path(ex["participants_file"])
    first = settle(["refdata", "load", "--securities", str(sec), "--participants",
                    str(part)], env)
    assert first["securities"] == {"added": 40, "changed": 0, "unchanged": 0}, first
    assert first["participants"] == {"added": 300, "changed": 0, "unchanged": 0}, first
    again = settle(["refdata", "load", "--securities", str(sec), "--participants",
                    str(part)], env)
    assert again["securities"] == {"added": 0, "changed": 0, "unchanged": 40}, again
    # One participant moved to another safekeeping account: that line changes.
    lines = part.read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ",SFK-MOVED"
    part.write_text("\n".join(lines) + "\n")
    moved = settle(["refdata", "load", "--participants", str(part)], env)
    assert moved["participants"] == {"added": 0, "changed": 1, "unchanged": 299}, moved
    # A file with one bad line and one new good one stores nothing; so does a file naming an
    # ISIN stored for another symbol.
    bad = tmp_path / "bad.csv"
    bad.write_text(SEC + "NEW1,US0378331005,037833100,USD\nNEW2,US0378331006,,USD\n")
    out = settle(["refdata", "load", "--securities", str(bad)], env, check=False)
    assert out["_returncode"] == 1 and "line 3: ISIN 'US0378331006'" in out["error"], out
    taken = tmp_path / "taken.csv"
    aapl_isin = read_securities(sec)[0].isin
    taken.write_text(SEC + f"NEW3,{aapl_isin},,USD\n")
    out = settle(["refdata", "load", "--securities", str(taken)], env, check=False)
    assert out["_returncode"] == 1 and f"ISIN {aapl_isin} is stored for symbol AAPL" in \
        out["error"], out
    with connect(isolated.settings.settlement_dsn) as conn:
        assert conn.execute("select count(*) from securities").fetchone() == (40,)
        assert conn.execute("select safekeeping_account from participants"
                            " where account = 'ACC0001'").fetchone() == ("SFK-MOVED",)
