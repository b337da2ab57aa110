-- ccp mode's open positions marked to market (issue 59). A fail carried into a set goes in at
-- its marked value (its quantity at the closing price of the set's trade date, else the
-- latest close published before it); the difference from the value it was carried with is
-- its mark, paid in the member's money line whether or not the delivery settles. Each mark
-- keeps the open position's first settlement date, so its age survives every carry.
-- Runnable with psql as is.
create table instruction_marks (
    run_id                bigint        not null references settlement_runs (run_id),
    instruction_id        text          not null references settlement_instructions (instruction_id),
    account               text          not null,
    symbol                text          not null,
    quantity              bigint        not null,  -- signed, as the fail's open quantity
    carried_amount        numeric(28,4) not null,  -- signed: its value before the mark
    close_price           numeric(18,4),           -- NULL: no close known, carried at its value
    price_date            date,
    marked_amount         numeric(28,4) not null,  -- signed: -quantity x close_price
    mark                  numeric(28,4) not null,  -- carried_amount - marked_amount
    first_settlement_date date          not null,  -- when the open position was first due
    age_days              integer       not null check (age_days >= 0),  -- settlement days
    primary key (run_id, instruction_id)
);
create index instruction_marks_instruction on instruction_marks (instruction_id);

-- A fail answered after the next date's set was written is carried into that set at once
-- (kind 'carry', ids R<run>-L<n>): an answer after the next close still reaches the next
-- settlement date.
alter table settlement_instructions drop constraint settlement_instructions_kind_check;
alter table settlement_instructions add constraint settlement_instructions_kind_check
    check (kind in ('instruct', 'cancel', 'delta', 'carry'));

grant select, insert on instruction_marks to settle_settlement;
grant select on instruction_marks to settle_auditor;
