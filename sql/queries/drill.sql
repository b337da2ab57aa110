-- Named statements of the failover drill checker (settlement/drill.py).

-- name: nonmonotonic
-- Offsets applied out of order within a partition: a row committed later (ingested_at is its
-- transaction's start) with an offset below one already applied before it.
select count(*) from (
    select kafka_offset,
           max(kafka_offset) over (partition by kafka_partition
                                   order by ingested_at, kafka_offset
                                   rows between unbounded preceding and 1 preceding) as before
    from trades where trade_date = %(trade_date)s
) t
where kafka_offset < before

-- name: last_partitions
-- What a site owned just before the fault, from its heartbeats.
select partitions from site_heartbeats
where site = %(site)s and beat_at <= %(before)s
order by beat_at desc limit 1

-- name: first_takeover
select min(ingested_at) from trades
where site = %(site)s and kafka_partition = any(%(partitions)s::int[])
  and ingested_at > %(after)s

-- name: first_after
select min(ingested_at) from trades where ingested_at > %(after)s

-- name: site_trades
-- How many trades a site has committed in this ledger (its progress through the day): of
-- one date, or of all (a drill's namespace holds one day).
select count(*) from trades
where site = %(site)s and (%(trade_date)s::date is null or trade_date = %(trade_date)s::date)

-- name: site_partitions
-- What a site owns now, from its latest heartbeat.
select partitions from site_heartbeats where site = %(site)s order by beat_at desc limit 1

-- name: writer_in_transaction
-- A site's ledger writer is inside a batch transaction (pg_stat_activity of this database).
select pid from pg_stat_activity
where datname = current_database() and application_name = %(application_name)s
  and xact_start is not null and state in ('active', 'idle in transaction')

-- name: site_stored_after
-- When a site first stored a trade after a moment (epoch seconds): the ledger's own clock,
-- the transaction's start (the site drills' ingest gap; the stack's servers share this host's
-- clock).
select extract(epoch from min(ingested_at)) from trades
where site = %(site)s and ingested_at > to_timestamp(%(after)s)

-- name: close_holder
-- Who holds the date's close lease now (settlement database), if anyone.
select holder, run_id from close_leases
where trade_date = %(trade_date)s and released_at is null and expires_at > now()

-- name: publications
-- Every run of the date that was published (one, whatever the faults), with its holder.
select run_id, holder from settlement_runs
where trade_date = %(trade_date)s and published_at is not null
order by run_id

-- name: run_statuses
-- The date's settlement runs by status (a close taken over is 'abandoned').
select status, count(*) from settlement_runs where trade_date = %(trade_date)s group by status

-- name: published_positions
-- The date's published net positions (settlement database), for an independent netting.
select account, symbol, net_qty, net_cash from positions where trade_date = %(trade_date)s

-- name: instruction_sets
-- Every run that wrote instructions for the date: one publication means one set.
select distinct run_id from settlement_instructions where trade_date = %(trade_date)s order by 1
