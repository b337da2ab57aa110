-- Validated-only publication. A run settles into these run-tagged tables first; only a run
-- whose validation passed, or that an operator explicitly accepted as incomplete, is copied
-- into positions / cash_obligations / instrument_summary, replacing its date's rows in one
-- transaction with the published_days row that names it. A failed run's results stay here
-- for inspection and the published day is left as it was.

create table run_positions (
    run_id bigint not null references settlement_runs (run_id),
    like positions,
    primary key (run_id, account, symbol)
);

create table run_cash_obligations (
    run_id bigint not null references settlement_runs (run_id),
    like cash_obligations,
    primary key (run_id, account)
);

create table run_instrument_summary (
    run_id bigint not null references settlement_runs (run_id),
    like instrument_summary,
    primary key (run_id, symbol)
);

-- The run whose results the published tables hold, per date: updated in the same
-- transaction as those tables, so the two always agree.
create table published_days (
    trade_date   date        primary key,
    run_id       bigint      not null references settlement_runs (run_id),
    published_at timestamptz not null default now()
);

alter table settlement_runs
    add column published_at timestamptz,
    -- The operator's reason for publishing a day that failed validation
    -- (settle eod --accept-incomplete "..."); null when the run was not forced.
    add column accepted_incomplete text;

grant select, insert, update, delete on run_positions, run_cash_obligations,
    run_instrument_summary, published_days to settle_settlement;
grant select on run_positions, run_cash_obligations, run_instrument_summary, published_days
    to settle_auditor;
