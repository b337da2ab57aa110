-- History that does not slow the day (issue 60, item 1), after `trades` (0023): the close's
-- tables and the ledger's amendments partitioned by trade date too, one partition a month.
-- Runnable with psql as is; existing rows move into the new tables.
--
-- A month, not a day: these tables hold thousands of rows a day, not millions (a day's
-- positions are its accounts times its symbols), and the close's tables are books and records
-- kept for years, never dropped. A month a partition keeps the count low (12 a year per table:
-- a lookup that names no date, as by run id, probes 12 small indexes, not 250), while a day's
-- reads and the publication's delete-and-insert touch one partition, and VACUUM and a later
-- move to cold storage take a month at a time.
--
-- Left as they are, on purpose (docs/architecture.md, "History does not slow the day"):
-- - `settlement_runs` and `settlement_instructions`: their keys (run id, instruction id) are
--   what the audit trail, the statuses, answers and marks of later days reference; a
--   partitioned table's key must hold its partition key, so every reference would have to
--   carry a date. One run and one instruction per position a day; read through those keys.
-- - `dead_letters`: a malformed message has no trade date, and its key is its Kafka
--   position, whatever the date; undated rows would need a default partition, and attaching
--   a month beside one locks it against the sites' inserts.
-- - the small per-day tables (close markers, leases, published days): a row or a few a day.
--
-- Unique keys: each table's key gains `trade_date` where it lacked it. It holds exactly as
-- before: a run has one date (run_*), and an amendment's date is its trade's (ingest refuses
-- any other, consumers.parse.amendment_refusal), and a trade id is unique across days (0023).

-- Creating a range partition when first needed, serialized as 0023's: the creators queue on
-- SHARE UPDATE EXCLUSIVE on the parent (not against inserts), which also refreshes the catalog
-- so a partition made while one waited is seen. Called by the SECURITY DEFINER functions
-- below, never granted.
create function attach_range_partition(parent text, part text, lo date, hi date)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if to_regclass('public.' || part) is not null then
        return 0;
    end if;
    execute format('lock table public.%I in share update exclusive mode', parent);
    if to_regclass('public.' || part) is not null then
        return 0;
    end if;
    execute format('create table public.%I (like public.%I including defaults '
                   'including constraints)', part, parent);
    execute format('alter table public.%I attach partition public.%I '
                   'for values from (%L) to (%L)', parent, part, lo, hi);
    return 1;
end
$$;

-- Each table's month of each of these days (`<table>_YYYYMM`). Never granted either.
create function attach_month_partitions(tables text[], days date[]) returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    m date;
    t text;
    made integer := 0;
begin
    for m in select distinct date_trunc('month', d)::date from unnest(days) d
             where d is not null order by 1 loop
        foreach t in array tables loop
            made := made + public.attach_range_partition(t, t || '_' || to_char(m, 'YYYYMM'),
                                                         m, (m + interval '1 month')::date);
        end loop;
    end loop;
    return made;
end
$$;

-- The ledger's partitions for these days: each day's `trades`, each month's `trade_amendments`.
-- The sites call it before storing a new day, the close for its day and the week after it, an
-- archive restore for the day it brings back.
create or replace function ensure_trade_partitions(days date[]) returns integer
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    d date;
    made integer := 0;
begin
    foreach d in array days loop
        continue when d is null;
        made := made + public.attach_range_partition(
            'trades', 'trades_' || to_char(d, 'YYYYMMDD'), d, d + 1);
    end loop;
    return made + public.attach_month_partitions(array['trade_amendments'], days);
end
$$;

-- The close's tables' partitions for these days' months: the close calls it before it stages
-- a run's results (settlement.close.pipeline.stage_results).
create function ensure_settlement_partitions(days date[]) returns integer
language sql security definer
set search_path = pg_catalog, pg_temp
return public.attach_month_partitions(
    array['positions', 'cash_obligations', 'instrument_summary', 'run_positions',
          'run_cash_obligations', 'run_instrument_summary'], days);

-- Moving a table: renamed aside with its indexes, the partitioned one created like it, its
-- months made, its rows copied, its grants given again, the old one dropped.
create function pg_temp.partition_by_month(tab text) returns void
language plpgsql
as $$
declare
    old text := tab || '_unpartitioned';
    g record;
begin
    execute format('alter table public.%I rename to %I', tab, old);
    for g in select indexrelid::regclass::text as name from pg_index
             where indrelid = ('public.' || old)::regclass loop
        execute format('alter index public.%I rename to %I', g.name, g.name || '_unpartitioned');
    end loop;
    execute format('create table public.%I (like public.%I including defaults '
                   'including constraints) partition by range (trade_date)', tab, old);
    execute format('select public.attach_month_partitions(array[%L], '
                   'array(select distinct trade_date from public.%I))', tab, old);
    execute format('insert into public.%I select * from public.%I', tab, old);
    for g in select a.privilege_type, r.rolname
             from pg_class c, aclexplode(c.relacl) a join pg_roles r on r.oid = a.grantee
             where c.oid = ('public.' || old)::regclass and a.grantee <> c.relowner loop
        execute format('grant %s on public.%I to %I', g.privilege_type, tab, g.rolname);
    end loop;
end
$$;

drop view positions_by_version;

do $$
begin
    perform pg_temp.partition_by_month(t)
    from unnest(array['trade_amendments', 'positions', 'cash_obligations',
                      'instrument_summary', 'run_positions', 'run_cash_obligations',
                      'run_instrument_summary']) t;
    -- The months of the days whose `trades` partitions 0023 made (some ahead, still empty),
    -- without a month of amendments: a bust of such a day finds its partition.
    perform public.attach_month_partitions(
        array['trade_amendments'],
        array(select to_date(right(c.relname, 8), 'YYYYMMDD')
              from pg_inherits i join pg_class c on c.oid = i.inhrelid
              where i.inhparent = 'public.trades'::regclass));
end
$$;
drop function pg_temp.partition_by_month(text);

drop table trade_amendments_unpartitioned, positions_unpartitioned,
    cash_obligations_unpartitioned, instrument_summary_unpartitioned,
    run_positions_unpartitioned, run_cash_obligations_unpartitioned,
    run_instrument_summary_unpartitioned;

-- One cancel per trade and one correction per version (0009), within the trade's date, which
-- is the trade's own: so across all dates as before.
create unique index trade_amendments_identity
    on trade_amendments (trade_date, trade_id, kind, coalesce(version, 0));
create index trade_amendments_date_partition_seq
    on trade_amendments (trade_date, kafka_partition, seq);

alter table positions add primary key (trade_date, account, symbol);
alter table cash_obligations add primary key (trade_date, account);
alter table instrument_summary add primary key (trade_date, symbol);
-- A run has one date: with it in front, the keys are the run's as before.
alter table run_positions add primary key (trade_date, run_id, account, symbol),
    add foreign key (run_id) references settlement_runs (run_id);
alter table run_cash_obligations add primary key (trade_date, run_id, account),
    add foreign key (run_id) references settlement_runs (run_id);
alter table run_instrument_summary add primary key (trade_date, run_id, symbol),
    add foreign key (run_id) references settlement_runs (run_id);

-- As 0012 made it, the run's date joined too so a run's rows are read from its month alone.
create view positions_by_version as
select r.trade_date, r.version, r.run_id, r.published_at, r.settlement_date,
       p.account, p.symbol, p.bought_qty, p.sold_qty, p.net_qty, p.buy_amount,
       p.sell_amount, p.net_cash, p.trade_count,
       r.run_id = d.run_id as current
from settlement_runs r
join run_positions p on p.trade_date = r.trade_date and p.run_id = r.run_id
left join published_days d on d.trade_date = r.trade_date
where r.version is not null;
grant select on positions_by_version to settle_settlement, settle_auditor;

revoke all on function attach_range_partition(text, text, date, date),
    attach_month_partitions(text[], date[]), ensure_settlement_partitions(date[]) from public;
grant execute on function ensure_settlement_partitions(date[]) to settle_settlement;
