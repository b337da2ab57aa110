-- History that does not slow the day (issue 60, item 1): `trades` partitioned by trade date,
-- one partition a day, so a day's reads, its archive and its removal touch that day alone
-- (archiving a day detaches and drops its partition instead of deleting row by row).
-- Runnable with psql as is; an existing ledger's rows move into the new table.
--
-- A partitioned table's unique keys must hold the partition key, so `trades` itself can only
-- keep a trade id unique within its day. The contract's idempotency key is the trade id
-- across all days, so it moves into `trade_ids`, a narrow registry of every trade id ever
-- stored with the day and the Kafka position of the copy kept. Ingest inserts into it first
-- (`on conflict (trade_id) do nothing`) and stores in `trades` exactly the copies it kept,
-- in one statement; a copy it refused is a replay, or a conflicting replay when its content
-- (its trade date included) differs from the kept copy's. Archiving leaves the registry
-- alone: a trade id is never reused, even after its day left the ledger.

create table trade_ids (
    trade_id        text    primary key,
    trade_date      date    not null,
    kafka_partition integer not null,
    kafka_offset    bigint  not null
);

alter table trades rename to trades_unpartitioned;
alter index trades_pkey rename to trades_unpartitioned_pkey;
drop index trades_date_partition_seq;  -- a day is one partition now: its reads scan it whole

create table trades (
    trade_id        text        not null,
    trade_date      date        not null,
    seq             bigint      not null,
    kafka_partition integer     not null,
    kafka_offset    bigint      not null,
    symbol          text        not null,
    price           numeric(18, 4) not null,
    quantity        bigint      not null,
    buyer           text        not null,
    seller          text        not null,
    executed_at     timestamptz not null,
    site            text        not null,
    ingested_at     timestamptz not null default now(),
    constraint trades_seq_check check (seq > 0),
    constraint trades_price_check check (price > 0),
    constraint trades_quantity_check check (quantity > 0),
    constraint trades_check check (seller <> buyer),
    primary key (trade_date, trade_id)
) partition by range (trade_date);

-- A day's partition, created when first needed: by a site before it stores the day's first
-- trade, by the close for the days ahead, by an archive restore. Never by hand. Created
-- standalone and then attached, which locks `trades` only against other attaches (SHARE
-- UPDATE EXCLUSIVE), not against the other site's inserts; that lock, taken first,
-- serializes the creators, so two sites meeting a new day make one partition. SECURITY
-- DEFINER: the sites' and the close's roles may add a day, not alter the table.
create function ensure_trade_partitions(days date[]) returns integer
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    d date;
    part text;
    made integer := 0;
begin
    foreach d in array days loop
        continue when d is null;
        part := 'trades_' || to_char(d, 'YYYYMMDD');
        continue when to_regclass('public.' || part) is not null;
        -- Creators queue here (the mode conflicts with itself, not with inserts), and taking
        -- it reads the catalog changes other sessions committed: a day made while we waited
        -- is then seen (an advisory lock would not refresh the catalog cache).
        lock table public.trades in share update exclusive mode;
        continue when to_regclass('public.' || part) is not null;
        execute format('create table public.%I (like public.trades including defaults '
                       'including constraints)', part);
        execute format('alter table public.trades attach partition public.%I '
                       'for values from (%L) to (%L)', part, d, d + 1);
        made := made + 1;
    end loop;
    return made;
end
$$;

-- Archiving a day: its partition's rows counted, then the partition detached and dropped, in
-- the caller's transaction (the caller compares the count with the archive's manifest and
-- rolls back on a difference: the partition comes back whole). 0 when the day has none.
create function drop_trade_partition(d date) returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    part text := 'trades_' || to_char(d, 'YYYYMMDD');
    n bigint;
begin
    if to_regclass('public.' || part) is null then
        return 0;
    end if;
    execute format('select count(*) from public.%I', part) into n;
    execute format('alter table public.trades detach partition public.%I', part);
    execute format('drop table public.%I', part);
    return n;
end
$$;

select ensure_trade_partitions(array(select distinct trade_date from trades_unpartitioned
                                     order by 1));
insert into trades select * from trades_unpartitioned;
insert into trade_ids (trade_id, trade_date, kafka_partition, kafka_offset)
select trade_id, trade_date, kafka_partition, kafka_offset from trades_unpartitioned;
drop table trades_unpartitioned;

revoke all on function ensure_trade_partitions(date[]), drop_trade_partition(date) from public;
grant execute on function ensure_trade_partitions(date[]) to settle_site, settle_settlement;
grant select, insert on trades, trade_ids to settle_site;
grant select on trades, trade_ids to settle_settlement, settle_auditor;
