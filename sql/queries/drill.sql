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
