-- Archives (issue 60): a published day's ledger rows older than the retention, written as
-- Parquet by `settle archive`, one manifest line per ledger and table with what proves the
-- copy whole (rows, an order-free checksum of every value, the files' SHA-256) and the run
-- that published the day. The rows leave the ledgers only after their manifest commits;
-- `settle archive restore` brings them back and records when. Runnable with psql as is.
create table day_archives (
    trade_date    date        not null,
    ledger        text        not null,
    table_name    text        not null,
    row_count     bigint      not null check (row_count >= 0),
    checksum      numeric     not null,  -- sum of Spark's xxhash64 over each row's values
    files_sha256  text        not null,  -- SHA-256 over the Parquet files, in name order
    path          text        not null,
    published_run bigint      not null references settlement_runs (run_id),
    archived_at   timestamptz not null default now(),
    removed_at    timestamptz,  -- when the day's rows left the ledgers
    restored_at   timestamptz,
    primary key (trade_date, ledger, table_name)
);

grant select on day_archives to settle_settlement, settle_auditor;
