"""The canonical row's hash in the Python worker (``row_hashes``): what the Kafka classifier's
workers compute for each trade, equal to Spark's ``settlement.spark.figures.row_hash`` and to
the ledger's SQL. Arrow and hashlib only, so a worker imports nothing of Spark for it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Between fields of the canonical row: the contract refuses control characters in text
# (``settlement.contract.CONTROL_CHARS``), so no field can contain the separator.
SEPARATOR = "\x1f"
_NO_DIGEST = bytes(16)

Column = pa.Array | Sequence[object]


def row_hashes(trade_id: Column, days: Column, seq: Column, partition: Column,
               symbol: Column, units: Column, quantity: Column, buyer: Column,
               seller: Column, micros: Column) -> tuple[pa.Array, pa.Array]:
    """``row_hash`` of each row of these columns (Arrow arrays, or sequences Arrow converts):
    the hash halves (high, low) of the canonical row of each row with a trade id, NULL for the
    others. ``days``: the date as days since 1970-01-01; ``units``: the price in 1/10,000;
    ``micros``: executed_at since the epoch. A NULL field is left out of the text, as
    ``concat_ws`` leaves it (a cancel's row has its id, date and seq only).

    The canonical rows are joined by Arrow (integers as decimal text, as Spark casts them)
    and only the digests are taken per row: the worker's output step for 200,000 rows took
    1.20 s with the text built in Python, 0.59 s so (docs/benchmarks.md)."""
    cols = [c if isinstance(c, pa.Array) else pa.array(c) for c in (
        trade_id, days, seq, partition, symbol, units, quantity, buyer, seller, micros)]
    texts = pc.binary_join_element_wise(
        *(c.cast(pa.string()) for c in cols), SEPARATOR, null_handling="skip")
    has_id = cols[0].is_valid()
    md5 = hashlib.md5
    digests = b"".join([_NO_DIGEST if t is None else md5(t).digest() for t in
                        pc.if_else(has_id, texts, None).cast(pa.binary()).to_pylist()])
    # The first 8 bytes of each digest, big-endian, split in two 32-bit halves.
    first = np.frombuffer(digests, dtype=">u8").reshape(-1, 2)[:, 0]
    mask = ~has_id.to_numpy(zero_copy_only=False)
    return (pa.array((first >> np.uint64(32)).astype(np.int64), mask=mask),
            pa.array((first & np.uint64(0xFFFFFFFF)).astype(np.int64), mask=mask))
