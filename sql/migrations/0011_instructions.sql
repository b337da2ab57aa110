-- Settlement instructions for the settlement date, and fails carried forward (issue 43).
-- Runnable with psql as is.

-- The day a run's trades settle (T+N settlement business days), known when the run starts.
alter table settlement_runs add column settlement_date date;

-- The instructions of a published run, written once (settlement.instructions.store): the
-- same run always yields the same ids and lines. A re-run of the date publishes a new run,
-- whose instructions supersede these (they stay for the audit trail).
create table settlement_instructions (
    instruction_id  text          primary key,
    run_id          bigint        not null references settlement_runs (run_id),
    trade_date      date          not null,
    settlement_date date          not null,
    account         text          not null,
    symbol          text          not null,
    side            text          not null check (side in ('DELI', 'RECE', 'NONE')),
    quantity        bigint        not null check (quantity >= 0),
    payment         text          not null check (payment in ('PAY', 'RECV', 'NONE')),
    amount          numeric(28, 4) not null check (amount >= 0),
    version         integer       not null check (version >= 1),
    -- the failed instructions this line carries in (';'-separated ids, '' for none)
    carried_from    text          not null default '',
    created_at      timestamptz   not null default now(),
    check ((side = 'NONE') = (quantity = 0)),
    check ((payment = 'NONE') = (amount = 0)),
    check (side <> 'NONE' or payment <> 'NONE'),
    unique (run_id, account, symbol)
);
create index settlement_instructions_date on settlement_instructions (settlement_date);

-- The settlement agent's answer per instruction (final once given), and what is left to
-- carry: all of a fail, the rest of a partial, nothing once settled whole (signed as the
-- instruction: + received). A fail stays open until a later run's instructions take it.
create table instruction_statuses (
    instruction_id   text          primary key
                                   references settlement_instructions (instruction_id),
    status           text          not null check (status in ('settled', 'failed')),
    settled_quantity bigint        check (settled_quantity >= 0),
    open_quantity    bigint        not null,
    open_amount      numeric(28, 4) not null,
    reported_at      timestamptz   not null default now(),
    source_file      text,
    carried_into_run bigint        references settlement_runs (run_id)
);
create index instruction_statuses_open on instruction_statuses (instruction_id)
    where carried_into_run is null and (open_quantity <> 0 or open_amount <> 0);

grant select, insert on settlement_instructions to settle_settlement;
grant select, insert, update on instruction_statuses to settle_settlement;
grant select on settlement_instructions, instruction_statuses to settle_auditor;
