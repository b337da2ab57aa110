-- A delta is stored once written (issue 59): `settle instructions --delta` gives the change
-- between a date's last two versions as lines of the current run (kind 'delta', ids
-- R<run>-D<n>), fixed from then on, so the agent's answers to them are known. Its lines are
-- not part of the run's set. Runnable with psql as is.
alter table settlement_instructions drop constraint settlement_instructions_kind_check;
alter table settlement_instructions add constraint settlement_instructions_kind_check
    check (kind in ('instruct', 'cancel', 'delta'));
create unique index settlement_instructions_run_delta on settlement_instructions
    (run_id, account, symbol) where kind = 'delta';
