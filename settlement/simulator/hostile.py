"""Hostile names for security drills (``settle simulate --hostile-names``).

Account names, symbols and trade-id suffixes that would do harm if any stage built HTML, SQL,
JSON or configuration from data by string formatting: markup that runs script or breaks a
table, quotes and SQL, bidirectional and astral unicode. Each is valid under the contract
(printable, within its field's length), so it travels gateway -> site -> ledger -> Spark ->
report as data. The script payloads mark the page (``document.title``, a ``data-pwned``
attribute) rather than pop a dialog, so a headless browser can tell whether any ran.

Besides every trade whose id carries the hostile suffix, the gateway sends a copy under
another id whose buyer holds an ESC control character: the contract refuses it, so it is a
dead letter, stored with its raw bytes and the reason (it takes no sequence number, so the
day stays complete).
"""

from __future__ import annotations

from settlement.contract import BUYER, SYMBOL, TRADE_ID

# What a payload that ran would write into the page: its title, or a data-pwned attribute.
PWNED_TITLES = ("PWNED", "1")

HOSTILE_SYMBOLS: tuple[str, ...] = (
    "<svg onload=document.title=1>",
    "</td></tr></table><h1>X",
    "O'NEIL\"; DROP TABLE trades;--",
    "\u202eLIAM\u202c",  # right-to-left override
    "株式会社",
    "𝔄𝔓𝔓𝔏",  # astral plane
)
HOSTILE_ACCOUNTS: tuple[str, ...] = (
    "<script>document.title='PWNED'</script>",
    "<img src=x onerror=\"document.body.dataset.pwned=1\">",
    "' OR '1'='1'; --",
    "\\\"quoted\\\" & 'single' `back`",
    "Zoë–Ünïcødé €😀",
    "${jndi:ldap://127.0.0.1:1/x} %s %n {0}",
)
# Refused by the contract (a C0 control character): its messages become dead letters.
CONTROL_ACCOUNT = "ACC\x1b[31mRED"
HOSTILE_TRADE_ID_SUFFIX = "<b onmouseover=\"document.title='PWNED'\">'\""

for _name, _limit in ([(s, SYMBOL.max_length) for s in HOSTILE_SYMBOLS]
                      + [(a, BUYER.max_length) for a in HOSTILE_ACCOUNTS]
                      + [("T00000000-000000000-" + HOSTILE_TRADE_ID_SUFFIX,
                          TRADE_ID.max_length)]):
    assert len(_name) <= _limit, f"{_name!r} is longer than its field allows"
