-- Reference data (issue 59): the instruments and the participants a settlement instruction
-- names (settlement/instructions/refdata.py, `settle refdata load`). Runnable with psql as is.
-- The loader checks check digits and codes; the constraints here keep the forms.

create table securities (
    symbol      text        primary key,
    isin        char(12)    not null unique check (isin ~ '^[A-Z]{2}[A-Z0-9]{9}[0-9]$'),
    cusip       char(9)     check (cusip ~ '^[A-Z0-9*@#]{8}[0-9]$'),
    currency    char(3)     not null check (currency ~ '^[A-Z]{3}$'),
    source_file text,
    loaded_at   timestamptz not null default now()
);

create table participants (
    account             text        primary key,
    participant_id      text        not null check (participant_id <> ''),
    bic                 text        not null
                                    check (bic ~ '^[A-Z]{6}[A-Z0-9]{2}([A-Z0-9]{3})?$'),
    safekeeping_account text        not null check (length(safekeeping_account) between 1 and 35),
    source_file         text,
    loaded_at           timestamptz not null default now()
);

-- The operator loads them with the settlement role (as the agent's answers); the auditor
-- reads them.
grant select, insert, update on securities, participants to settle_settlement;
grant select on securities, participants to settle_auditor;
