"""Reference data (issue 59): the instruments and the participants a settlement instruction
names. A custodian or a CSD refuses an instruction that names a security by ticker or a party
by an internal account: it wants the ISIN, the participant's BIC and its safekeeping account.

``settle refdata load --securities FILE --participants FILE`` reads two CSV files

- securities: ``symbol,isin,cusip,currency`` (the CUSIP may be empty), and
- participants: ``account,participant_id,bic,safekeeping_account``,

checks every line (the ISIN's and the CUSIP's check digits and the BIC's form by
python-stdnum, the currency against ISO 4217 as CLDR knows it by Babel), and stores them in
the settlement database in one transaction: all of it or, with one bad line, nothing, and
every bad line named. Loading the same files again changes nothing.

``settle refdata example --out DIR`` writes files that cover the simulator's symbols and
accounts (settlement.simulator.gateway), with check digits that verify, for a demo or a test.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any, TypeVar

from settlement.config import Settings
from settlement.contract import BUYER, SYMBOL
from settlement.db import connect, q

SECURITIES_HEADER = ("symbol", "isin", "cusip", "currency")
PARTICIPANTS_HEADER = ("account", "participant_id", "bic", "safekeeping_account")
# A file's bad lines named in the error, at most (the count says how many more).
MAX_NAMED = 20


class RefDataError(ValueError):
    """A reference data file is refused (nothing stored); the message names each bad line."""


@dataclass(frozen=True)
class Security:
    symbol: str
    isin: str
    cusip: str | None
    currency: str


@dataclass(frozen=True)
class Participant:
    account: str
    participant_id: str
    bic: str
    safekeeping_account: str


_Row = TypeVar("_Row", "Security", "Participant")


def _currencies() -> frozenset[str]:
    from babel.numbers import list_currencies

    return frozenset(list_currencies())


def check_security(symbol: str, isin: str, cusip: str, currency: str) -> list[str]:
    """What is wrong with one securities line (empty: nothing)."""
    from stdnum import cusip as cusip_
    from stdnum import isin as isin_
    from stdnum.exceptions import ValidationError

    problems = []
    if not symbol or len(symbol) > SYMBOL.max_length:
        problems.append(f"symbol must be 1-{SYMBOL.max_length} characters")
    try:
        isin_.validate(isin)
    except ValidationError as e:
        problems.append(f"ISIN {isin!r}: {e.message.rstrip('.').lower()}")
    if cusip:
        try:
            cusip_.validate(cusip)
        except ValidationError as e:
            problems.append(f"CUSIP {cusip!r}: {e.message.rstrip('.').lower()}")
        # A US or Canadian ISIN is its country code, the CUSIP and a check digit.
        if isin[:2] in ("US", "CA") and len(isin) == 12 and isin[2:11] != cusip:
            problems.append(f"CUSIP {cusip!r} is not the one inside ISIN {isin!r}")
    if currency not in _currencies():
        problems.append(f"currency {currency!r} is not an ISO 4217 code (e.g. USD)")
    return problems


def check_participant(account: str, participant_id: str, bic: str,
                      safekeeping_account: str) -> list[str]:
    """What is wrong with one participants line (empty: nothing)."""
    from stdnum import bic as bic_
    from stdnum.exceptions import ValidationError

    problems = []
    if not account or len(account) > BUYER.max_length:
        problems.append(f"account must be 1-{BUYER.max_length} characters")
    if not participant_id:
        problems.append("participant_id is empty")
    try:
        bic_.validate(bic)
    except ValidationError as e:
        problems.append(f"BIC {bic!r}: {e.message.rstrip('.').lower()}")
    # sese.023's SfkpgAcct/Id: Max35Text.
    if not 1 <= len(safekeeping_account) <= 35:
        problems.append("safekeeping_account must be 1-35 characters")
    return problems


def _rows(path: Path, data: bytes, header: tuple[str, ...]
          ) -> Iterable[tuple[int, list[str]]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RefDataError(f"{path}: not UTF-8 text") from None
    # csv's own line splitting: str.splitlines would also split at U+2028 and the like.
    reader = csv.reader(io.StringIO(text, newline=""))
    first = next(reader, None)
    if first is None or tuple(c.strip().lower() for c in first) != header:
        raise RefDataError(f"{path}: the first line must be the header {','.join(header)}")
    for row in reader:
        if row and any(c.strip() for c in row):
            # The codes lose surrounding blanks; a symbol or an account is kept exactly as
            # the trades carry it.
            yield reader.line_num, [row[0], *(c.strip() for c in row[1:])]


def _read(path: Path, header: tuple[str, ...],
          make: Callable[[list[str]], tuple[_Row, list[str], tuple[str, ...]]]
          ) -> tuple[list[_Row], str]:
    """A reference file's rows, each made and checked by ``make`` (the row, its problems,
    the keys no other line may repeat), and the SHA-256 of the bytes they came from; every
    problem named, or nothing (RefDataError)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RefDataError(f"{path}: no such file") from None
    out: list[_Row] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for line, row in _rows(path, data, header):
        if len(row) != len(header):
            errors.append(f"line {line}: {len(row)} fields, expected {len(header)}")
            continue
        item, problems, keys = make(row)
        for key in keys:
            if key in seen:
                problems.append(f"{key} is on line {seen[key]} too")
            seen.setdefault(key, line)
        errors += [f"line {line}: {p}" for p in problems]
        out.append(item)
    if errors:
        more = len(errors) - MAX_NAMED
        raise RefDataError(f"{path}: nothing loaded: " + "; ".join(errors[:MAX_NAMED])
                           + (f"; and {more} more" if more > 0 else ""))
    return out, hashlib.sha256(data).hexdigest()


def _security(row: list[str]) -> tuple[Security, list[str], tuple[str, ...]]:
    symbol, isin, cusip, currency = row[0], row[1].upper(), row[2].upper(), row[3].upper()
    return (Security(symbol, isin, cusip or None, currency),
            check_security(symbol, isin, cusip, currency), (f"symbol {symbol}", f"ISIN {isin}"))


def _participant(row: list[str]) -> tuple[Participant, list[str], tuple[str, ...]]:
    p = Participant(row[0], row[1], row[2].upper(), row[3])
    return p, check_participant(*astuple(p)), (f"account {p.account}",)


def read_securities(path: Path) -> list[Security]:
    return _read(path, SECURITIES_HEADER, _security)[0]


def read_participants(path: Path) -> list[Participant]:
    return _read(path, PARTICIPANTS_HEADER, _participant)[0]


def load(settings: Settings, securities: Path | None, participants: Path | None
         ) -> dict[str, Any]:
    """Both files checked, then stored in one transaction (upserts: a line changed since the
    last load replaces the stored one). Returns what changed."""
    if securities is None and participants is None:
        raise RefDataError("nothing to load: give --securities FILE and/or --participants FILE")
    secs, secs_sha = _read(securities, SECURITIES_HEADER, _security) if securities else ([], None)
    parts, parts_sha = (_read(participants, PARTICIPANTS_HEADER, _participant) if participants
                        else ([], None))
    s = settings.for_component("settlement")
    out: dict[str, Any] = {}
    with connect(s.settlement_dsn) as conn, conn.transaction():
        if secs:
            # Another symbol already stored under one of these ISINs: refused by name
            # rather than by the unique index's message.
            taken = conn.execute(q("refdata", "isin_taken"), {
                "symbols": [x.symbol for x in secs], "isins": [x.isin for x in secs]}).fetchall()
            if taken:
                raise RefDataError(f"{securities}: nothing loaded: " + "; ".join(
                    f"ISIN {isin} is stored for symbol {other}" for isin, other in taken))
            out["securities"] = _upsert(conn, "upsert_security", securities, [
                {"symbol": x.symbol, "isin": x.isin, "cusip": x.cusip,
                 "currency": x.currency} for x in secs])
        if parts:
            out["participants"] = _upsert(conn, "upsert_participant", participants, [
                {"account": x.account, "participant_id": x.participant_id, "bic": x.bic,
                 "safekeeping_account": x.safekeeping_account} for x in parts])
    return {**out, "securities_file": str(securities) if securities else None,
            "securities_sha256": secs_sha,
            "participants_file": str(participants) if participants else None,
            "participants_sha256": parts_sha}


def lookup(dsn: str, symbols: Iterable[str], accounts: Iterable[str]
           ) -> tuple[dict[str, Security], dict[str, Participant]]:
    """The stored securities and participants of these symbols and accounts (a name the
    reference data does not have is absent)."""
    with connect(dsn) as conn:
        secs = {r[0]: Security(*r) for r in conn.execute(
            q("refdata", "securities_of"), {"symbols": sorted(set(symbols))})}
        parts = {r[0]: Participant(*r) for r in conn.execute(
            q("refdata", "participants_of"), {"accounts": sorted(set(accounts))})}
    return secs, parts


def _upsert(conn: Any, query: str, path: Path | None, rows: list[dict[str, Any]]
            ) -> dict[str, int]:
    counts = {"added": 0, "changed": 0, "unchanged": 0}
    for row in rows:
        got = conn.execute(q("refdata", query), {**row, "source_file": str(path)}).fetchone()
        # The upsert returns a row only when it wrote one: xmax = 0 for an insert.
        if got is None:
            counts["unchanged"] += 1
        else:
            counts["added" if got[0] else "changed"] += 1
    return counts


def _isin_of(n: int) -> tuple[str, str]:
    """A made-up US ISIN and its CUSIP for the simulator's ``n``-th symbol, with check
    digits that verify (issuer 'ZZS' + the number: no real issuer code starts with ZZ)."""
    from stdnum import cusip as cusip_
    from stdnum import isin as isin_

    base = f"ZZS{n:05d}"
    cusip = base + cusip_.calc_check_digit(base)
    return "US" + cusip + isin_.calc_check_digit("US" + cusip), cusip


def example(out: Path, symbols: Iterable[str], accounts: Iterable[str],
            currency: str = "USD") -> dict[str, Any]:
    """Reference files for these symbols and accounts: ``out``/securities.csv and
    ``out``/participants.csv. Every line passes the checks above."""
    out.mkdir(parents=True, exist_ok=True)
    sec_path, part_path = out / "securities.csv", out / "participants.csv"
    with sec_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SECURITIES_HEADER)
        n_sec = 0
        for n_sec, symbol in enumerate(symbols, start=1):
            isin, cusip = _isin_of(n_sec)
            w.writerow((symbol, isin, cusip, currency))
    with part_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PARTICIPANTS_HEADER)
        n_part = 0
        for n_part, account in enumerate(accounts, start=1):
            # Ten made-up participants (clearing brokers), each holding many accounts.
            broker = n_part % 10
            w.writerow((account, f"P{broker:04d}", f"SIMBUS3{broker}XXX",
                        f"SFK-{broker:02d}-{n_part:06d}"))
    return {"securities_file": str(sec_path), "securities": n_sec,
            "participants_file": str(part_path), "participants": n_part}
