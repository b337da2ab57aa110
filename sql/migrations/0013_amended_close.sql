-- The amended close (issue 45): busts and corrections decided after a day's close. A cancel or
-- correction of day D that arrives on a partition after D's close marker is a `late` dead
-- letter, as before, and is also held here with its message type; an amended close marker of
-- D behind it on the partition (`"amended": k`, its last_seq covering the amendment's seq)
-- decides it: stored as a post-close amendment of D (trade_amendments.amended = k), or refused
-- for the reason amendment_refusal gives. Held ones no amended close covers stay late dead
-- letters. Sites append; the verdict columns are filled once, by the site that keeps the
-- marker, in the marker's transaction. Runnable with psql as is.

-- The amended close markers of a day's partition, k = 1, 2, ...; close_markers keeps the
-- day's close itself (its offset is where the day closed for late trades).
create table amended_close_markers (
    trade_date      date        not null,
    kafka_partition integer     not null,
    amended         integer     not null check (amended >= 1),
    last_seq        bigint      not null check (last_seq >= 0),
    kafka_offset    bigint      not null,
    site            text        not null,
    ingested_at     timestamptz not null default now(),
    primary key (trade_date, kafka_partition, amended)
);

create table late_amendments (
    topic           text        not null,
    kafka_partition integer     not null,
    kafka_offset    bigint      not null,
    trade_date      date        not null,
    kind            text        not null check (kind in ('cancel', 'correct')),
    seq             bigint      not null,
    raw             bytea       not null,
    site            text        not null,
    ingested_at     timestamptz not null default now(),
    -- the amended close that decided it, and how: 'stored', 'replay' or the refusal's reason
    amended         integer     check (amended >= 1),
    verdict         text        check ((amended is null) = (verdict is null)),
    primary key (topic, kafka_partition, kafka_offset)
);
create index late_amendments_held on late_amendments (trade_date, kafka_partition, kafka_offset)
    where amended is null;

-- Which amended close made an amendment a post-close one (NULL: sent before the close).
alter table trade_amendments add column amended integer check (amended >= 1);

grant select, insert on amended_close_markers, late_amendments to settle_site;
grant update (amended, verdict) on late_amendments to settle_site;
grant select on amended_close_markers, late_amendments to settle_settlement, settle_auditor;
