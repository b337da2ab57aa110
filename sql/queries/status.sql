-- Named reads of `settle status` (settlement/status.py). Read only, and cheap on a ledger of
-- any age: an index probe per site for its last heartbeat, the offsets table, the runs' index.

-- name: last_heartbeats
-- Each site's newest heartbeat (one index probe per site on (site, beat_at)), and its age by
-- the database clock, the one that stamped it.
select s.site, h.scheme, h.beat_at, extract(epoch from now() - h.beat_at), h.partitions,
       h.trades_total
from (select distinct site from site_heartbeats) s
cross join lateral (select scheme, beat_at, partitions, trades_total from site_heartbeats h
                    where h.site = s.site order by beat_at desc limit 1) h
order by s.site

-- name: stored_offsets
select consumer_group, kafka_partition, next_offset, site, updated_at
from consumer_offsets where topic = %(topic)s
order by consumer_group, kafka_partition

-- name: last_runs
-- The latest run of each of the newest dates, newest first.
select r.trade_date, r.run_id, r.source, r.status, r.validation_success,
       p.run_id is not null and p.run_id = r.run_id, r.finished_at, r.report_path, r.error,
       r.settlement_date
from (select distinct on (trade_date) * from settlement_runs
      order by trade_date desc, started_at desc) r
left join published_days p on p.trade_date = r.trade_date
order by r.trade_date desc
limit %(days)s

-- name: amended_closes
-- A ledger's amended close markers (all dates, or one) with the post-close amendments each
-- made stored, and when each marker arrived (settlement.status.awaiting_reclose).
select m.trade_date, m.kafka_partition, m.amended, m.ingested_at,
       (select count(*) from trade_amendments t
        where t.trade_date = m.trade_date and t.kafka_partition = m.kafka_partition
          and t.amended = m.amended)
from amended_close_markers m
where %(trade_date)s::date is null or m.trade_date = %(trade_date)s

-- name: published_amended_closes
-- Each published day's run, its version, and the amended closes it settled (recorded by
-- start_run from the ledgers the run was chosen against).
select p.trade_date, r.run_id, r.version, r.offsets -> 'amended_closes'
from published_days p
join settlement_runs r on r.run_id = p.run_id
where %(trade_date)s::date is null or p.trade_date = %(trade_date)s
