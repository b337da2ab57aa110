-- Custodian mode (issue 59): a failed instruction stays pending and is answered again when it
-- settles; a re-close cancels what it changes (sese.020) and instructs again, linked to what
-- it replaces; every answer to every id ever sent is kept. Runnable with psql as is.

-- The mode a run's instruction set was written in ('ccp' or 'custodian'): its files are
-- rendered in that mode whatever the settings say later (filled in once, as the run's other
-- records: migration 0007).
alter table settlement_runs add column instructions_mode text
    check (instructions_mode in ('ccp', 'custodian'));
update settlement_runs set instructions_mode = 'ccp'
where run_id in (select run_id from settlement_instructions);

-- A line instructs ('instruct') or cancels an instruction sent before ('cancel', linking the
-- one it cancels, with that one's side, quantity and amount). `links`: the instructions a
-- line cancels or replaces (';'-separated, '' for none).
alter table settlement_instructions
    add column kind text not null default 'instruct' check (kind in ('instruct', 'cancel')),
    add column links text not null default '';
alter table settlement_instructions drop constraint settlement_instructions_run_id_account_symbol_key;
create unique index settlement_instructions_run_key on settlement_instructions
    (run_id, account, symbol) where kind = 'instruct';
create index settlement_instructions_trade_date on settlement_instructions (trade_date);

-- Every answer recorded, in the order applied (instruction_statuses holds the latest).
create table instruction_answers (
    answer_id        bigint        generated always as identity primary key,
    instruction_id   text          not null references settlement_instructions (instruction_id),
    status           text          not null check (status in ('settled', 'failed')),
    settled_quantity bigint        check (settled_quantity >= 0),
    source_file      text,
    file_line        integer,
    recorded_at      timestamptz   not null default now()
);
create index instruction_answers_instruction on instruction_answers (instruction_id);

grant select, insert on instruction_answers to settle_settlement;
grant select on instruction_answers to settle_auditor;
