-- Settlement tables: end-of-day results per trade date. Every run replaces its date's rows
-- in one transaction (delete + insert of that date only), so reruns are idempotent.

create table positions (
    trade_date   date    not null,
    account      text    not null,
    symbol       text    not null,
    bought_qty   bigint  not null,
    sold_qty     bigint  not null,
    net_qty      bigint  not null,
    buy_amount   numeric(28, 4) not null,
    sell_amount  numeric(28, 4) not null,
    net_cash     numeric(28, 4) not null,  -- sell_amount - buy_amount
    trade_count  bigint  not null,
    primary key (trade_date, account, symbol)
);

-- Multilateral netting against the central counterparty: one obligation per account.
create table cash_obligations (
    trade_date   date    not null,
    account      text    not null,
    buy_amount   numeric(28, 4) not null,
    sell_amount  numeric(28, 4) not null,
    net_cash     numeric(28, 4) not null,  -- > 0: CCP pays the account; < 0: account pays
    trade_count  bigint  not null,
    primary key (trade_date, account)
);

create table instrument_summary (
    trade_date   date    not null,
    symbol       text    not null,
    trades       bigint  not null,
    volume       bigint  not null,
    notional     numeric(28, 4) not null,
    vwap         numeric(28, 10) not null,
    low_price    numeric(18, 4) not null,
    high_price   numeric(18, 4) not null,
    primary key (trade_date, symbol)
);

create table settlement_runs (
    run_id              bigserial   primary key,
    trade_date          date        not null,
    source              text        not null check (source in ('kafka', 'db')),
    source_reason       text        not null,
    status              text        not null check (status in ('running', 'succeeded', 'failed')),
    trades              bigint,
    duplicates_removed  bigint,
    malformed           bigint,
    positions           bigint,
    accounts            bigint,
    gross_notional      numeric(28, 4),
    netting_efficiency  numeric(12, 10),
    offsets             jsonb,       -- per-partition offset ranges read
    timings             jsonb,       -- seconds per step
    validation_success  boolean,
    validation          jsonb,
    report_path         text,
    error               text,
    started_at          timestamptz not null default now(),
    finished_at         timestamptz
);
create index settlement_runs_date on settlement_runs (trade_date, started_at);

create table audit_reports (
    trade_date   date        not null,
    run_id       bigint      not null references settlement_runs (run_id),
    created_at   timestamptz not null default now(),
    report_json  jsonb       not null,
    html_path    text        not null,
    primary key (trade_date, run_id)
);
