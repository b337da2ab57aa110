-- Trade busts and corrections (issue 28): FIX ExecType H (trade cancel) and G (trade correct)
-- after the trade was sent. One row per accepted amendment, written by the site that ingested
-- it in the batch's transaction (offsets and fencing as for trades). The trade's own row is
-- never rewritten (sites append only): its final state is the trade with its highest
-- correction applied, left out when cancelled (settlement.spark.transforms.final_trades).
-- Runnable with psql as is.
create table trade_amendments (
    trade_id        text        not null,
    trade_date      date        not null,
    -- the amendment's own exchange sequence number: its partition's next, counted in the
    -- day's close marker like a trade's
    seq             bigint      not null check (seq > 0),
    kafka_partition integer     not null,
    kafka_offset    bigint      not null,
    kind            text        not null check (kind in ('cancel', 'correct')),
    -- a correction's version (the original trade is 1); NULL for a cancel
    version         integer     check ((kind = 'correct') = (version is not null)
                                       and (version is null or version >= 2)),
    reason          text        check ((kind = 'cancel') = (reason is not null)),
    -- a correction's new values (NULL for a cancel)
    symbol          text,
    price           numeric(18, 4) check (price > 0),
    quantity        bigint      check (quantity > 0),
    buyer           text,
    seller          text        check (seller <> buyer),
    executed_at     timestamptz,
    site            text        not null,
    ingested_at     timestamptz not null default now(),
    check ((kind = 'correct') = (symbol is not null and price is not null
                                 and quantity is not null and buyer is not null
                                 and seller is not null and executed_at is not null))
);
-- One cancel per trade and one correction per version: a replay is suppressed, a different
-- message under the same identity is a conflicting replay (a dead letter).
create unique index trade_amendments_identity
    on trade_amendments (trade_id, kind, coalesce(version, 0));
create index trade_amendments_date_partition_seq
    on trade_amendments (trade_date, kafka_partition, seq);

-- Sites append; settlement and auditors read (as 0003 and 0007 for the other ledger tables).
grant select, insert on trade_amendments to settle_site;
grant select on trade_amendments to settle_settlement, settle_auditor;
