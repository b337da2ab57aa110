-- Named statements of the audit report (settlement/report/).

-- name: store_report
-- Append-only (migration 0007): a run has one report, written once.
insert into audit_reports (trade_date, run_id, report_json, html_path)
values (%(trade_date)s, %(run_id)s, %(report_json)s, %(html_path)s)

-- name: stored_report
select trade_date::text, report_json, html_path from audit_reports where run_id = %(run_id)s

-- Every figure of a day's report comes from that day only (issue 16). Two notions of "the
-- day" inside a ledger, both derived from its close markers, so they hold across restarts,
-- takeovers and any number of days kept in one ledger:
--
-- * the day's offsets, per partition: after the newest close marker of an earlier day, up to
--   and including the day's own marker (a partition the day has not closed yet: up to the
--   first marker of a later day, else open). Exact: dead letters are counted by offset.
-- * the day's ingestion window, in time: after the commit of the last close marker of an
--   earlier day, up to the commit of the day's last close marker once every partition has
--   one (else up to the first marker of a later day, else open). Batches and heartbeats carry
--   only a time, so they are counted by it. A batch commits its markers in its own
--   transaction, so a marker's ingested_at equals that batch's committed_at: the batch that
--   closed the previous day stays in the previous day.

-- name: dead_letters_by_reason
-- A dead letter that knows its day (a late trade) counts on that day; any other one on the
-- day whose offsets hold it. Range scans on the primary key (topic, partition, offset).
with bounds as (
    select p.kafka_partition,
           coalesce((select max(m.kafka_offset) from close_markers m
                     where m.kafka_partition = p.kafka_partition
                       and m.trade_date < %(trade_date)s), -1) as after_offset,
           coalesce((select m.kafka_offset from close_markers m
                     where m.kafka_partition = p.kafka_partition
                       and m.trade_date = %(trade_date)s),
                    (select min(m.kafka_offset) from close_markers m
                     where m.kafka_partition = p.kafka_partition
                       and m.trade_date > %(trade_date)s),
                    9223372036854775807) as through_offset
    from generate_series(0, %(partitions)s - 1) as p (kafka_partition)
)
select reason, count(*) from (
    select d.reason from dead_letters d
    where d.topic = %(topic)s and d.trade_date = %(trade_date)s
    union all
    select d.reason from bounds b
    join dead_letters d on d.topic = %(topic)s and d.kafka_partition = b.kafka_partition
                       and d.kafka_offset > b.after_offset
                       and d.kafka_offset <= b.through_offset
    where d.trade_date is null
) x
group by 1

-- name: ingest_window
-- The day's ingestion window (start_at exclusive, end_at inclusive; see above); null is an
-- open end.
select (select max(ingested_at) from close_markers where trade_date < %(trade_date)s),
       coalesce((select max(ingested_at) from close_markers
                 where trade_date = %(trade_date)s
                 having count(*) >= %(partitions)s),
                (select min(ingested_at) from close_markers where trade_date > %(trade_date)s))

-- name: ingest_batches
-- The window's committed batches (a day of 10M trades is ~500 rows), bucketed for the chart.
select site, committed_at, inserted from ingest_batches
where committed_at > %(start_at)s and committed_at <= %(end_at)s
order by committed_at

-- name: duplicates_by_site
select site, sum(duplicates), sum(inserted), sum(dead_letters) from ingest_batches
where committed_at > %(start_at)s and committed_at <= %(end_at)s
group by 1

-- name: heartbeat_events
-- Failover evidence from the window's heartbeats, aggregated here rather than loading a beat
-- per site per second into Python: a beat that came more than the gap after the site's
-- previous one (the site was silent), a beat whose partitions differ from the previous one
-- (ownership moved; sites store them sorted), and each site's last beat.
with b as (
    select site, beat_at, partitions,
           lag(beat_at) over w as prev_at, lag(partitions) over w as prev_parts,
           row_number() over (partition by site order by beat_at desc) as from_last
    from site_heartbeats
    where beat_at > %(start_at)s and beat_at <= %(end_at)s
    window w as (partition by site order by beat_at)
)
select site, beat_at, partitions, prev_at, prev_parts, from_last = 1 from b
where from_last = 1
   or (prev_at is not null and (beat_at - prev_at > %(gap)s or partitions <> prev_parts))
order by beat_at

-- name: heartbeat_stats
select site, count(*), min(beat_at), max(beat_at) from site_heartbeats
where beat_at > %(start_at)s and beat_at <= %(end_at)s
group by 1
