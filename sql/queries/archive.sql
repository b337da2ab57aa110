-- Named statements of the archives (settlement/archive.py; table in migration 0022).

-- name: to_archive
-- Published days before the cutoff with no archive standing (never archived, or restored).
select p.trade_date, p.run_id from published_days p
where p.trade_date < %(before)s
  and not exists (select 1 from day_archives a
                  where a.trade_date = p.trade_date and a.restored_at is null)
order by p.trade_date

-- name: archived_days
-- Days archived whose rows were not yet all removed from the ledgers (a run that stopped).
select distinct trade_date from day_archives
where trade_date < %(before)s and restored_at is null and removed_at is null
order by trade_date

-- name: record
insert into day_archives (trade_date, ledger, table_name, row_count, checksum, files_sha256,
                          path, published_run)
values (%(trade_date)s, %(ledger)s, %(table_name)s, %(row_count)s, %(checksum)s,
        %(files_sha256)s, %(path)s, %(published_run)s)
on conflict (trade_date, ledger, table_name) do update
set row_count = excluded.row_count, checksum = excluded.checksum,
    files_sha256 = excluded.files_sha256, path = excluded.path,
    published_run = excluded.published_run, archived_at = now(), removed_at = null,
    restored_at = null

-- name: removed
update day_archives set removed_at = now() where trade_date = %(trade_date)s

-- name: manifest
select ledger, table_name, row_count, checksum, files_sha256, path from day_archives
where trade_date = %(trade_date)s and restored_at is null
order by ledger, table_name

-- name: restored
update day_archives set restored_at = now() where trade_date = %(trade_date)s
  and restored_at is null

-- name: list
select trade_date::text, ledger, table_name, row_count, published_run, archived_at,
       removed_at, restored_at
from day_archives order by trade_date, ledger, table_name

-- The delete_<table> statements each return how many rows left the ledger.

-- name: delete_trades
-- The day's partition of `trades`, counted, detached and dropped (sql/migrations/0023); the
-- trade ids stay in trade_ids, so none is ever taken again.
select drop_trade_partition(%(trade_date)s)

-- name: delete_trade_amendments
with gone as (delete from trade_amendments where trade_date = %(trade_date)s returning 1)
select count(*) from gone

-- name: delete_dead_letters
with gone as (delete from dead_letters where trade_date = %(trade_date)s returning 1)
select count(*) from gone

-- name: delete_late_amendments
with gone as (delete from late_amendments where trade_date = %(trade_date)s returning 1)
select count(*) from gone

-- name: trade_partition
-- The day's partition of `trades`, back before its rows are restored.
select ensure_trade_partitions(array[%(trade_date)s::date])
