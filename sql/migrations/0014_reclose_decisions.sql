-- The re-close's approval (issue 45): an operator approves or rejects, in the Airflow UI, a
-- re-close that was computed and validated but not yet published. Every decision is kept
-- (who, when, which run, what the delta was): part of the append-only audit trail.
-- Runnable with psql as is.
create table reclose_decisions (
    decision_id     bigserial   primary key,
    run_id          bigint      not null references settlement_runs (run_id),
    trade_date      date        not null,
    decision        text        not null check (decision in ('approved', 'rejected')),
    decided_by      text        not null,
    decided_at      timestamptz not null default now(),
    -- the delta shown to the operator (changed positions, accounts, quantities and cash moved)
    delta           jsonb       not null,
    -- what came of it: the version published, or why nothing was
    outcome         text        not null
);
create index reclose_decisions_date on reclose_decisions (trade_date);

grant select, insert on reclose_decisions to settle_settlement;
grant usage on sequence reclose_decisions_decision_id_seq to settle_settlement;
grant select on reclose_decisions to settle_auditor;
