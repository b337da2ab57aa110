"""The canonical row's hash in Python (``row_hashes``): what the Kafka classifier's workers
compute for each trade, equal to Spark's ``settlement.spark.figures.row_hash`` and to the
ledger's SQL. Pure Python, so a worker imports nothing of Spark for it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# Between fields of the canonical row: the contract refuses control characters in text
# (``settlement.contract.CONTROL_CHARS``), so no field can contain the separator.
SEPARATOR = "\x1f"


def row_hashes(trade_id: Sequence[str | None], days: Sequence[int | None],
               seq: Sequence[int | None], partition: Sequence[int],
               symbol: Sequence[str | None], units: Sequence[int | None],
               quantity: Sequence[int | None], buyer: Sequence[str | None],
               seller: Sequence[str | None], micros: Sequence[int | None]
               ) -> tuple[list[int | None], list[int | None]]:
    """``row_hash`` of each row of these columns, in Python: the hash halves (high, low) of
    the canonical row of each row with a trade id, None for the others. ``days``: the date as
    days since 1970-01-01; ``units``: the price in 1/10,000; ``micros``: executed_at since
    the epoch. A NULL field is left out of the text, as ``concat_ws`` leaves it (a cancel's
    row has its id, date and seq only)."""
    md5, sep = hashlib.md5, SEPARATOR
    his: list[int | None] = [None] * len(trade_id)
    los: list[int | None] = [None] * len(trade_id)
    for i, fields in enumerate(zip(trade_id, days, seq, partition, symbol, units, quantity,
                                   buyer, seller, micros, strict=True)):
        if fields[0] is None:
            continue
        text = sep.join(map(str, fields) if None not in fields
                        else [str(f) for f in fields if f is not None])
        h = int.from_bytes(md5(text.encode()).digest()[:8], "big")
        his[i], los[i] = h >> 32, h & 0xFFFFFFFF
    return his, los
