-- Named statements of the end of day (settlement/eod/sources.py, settlement/eod/pipeline.py).

-- name: close_markers
-- Each partition's close of the day: its latest amended close marker where there is one (its
-- last_seq covers the post-close amendments, its offset ends the day's messages), with the
-- close marker's own offset.
select m.kafka_partition, greatest(m.last_seq, coalesce(a.last_seq, 0)),
       coalesce(a.kafka_offset, m.kafka_offset), coalesce(a.amended, 0), m.kafka_offset
from close_markers m
left join lateral (select amended, last_seq, kafka_offset from amended_close_markers x
                   where x.trade_date = m.trade_date and x.kafka_partition = m.kafka_partition
                   order by amended desc limit 1) a on true
where m.trade_date = %(trade_date)s

-- name: marked_rows
-- The day's seqs by its close markers (settlement.eod.sources.marked_rows): its size, about.
select coalesce(sum(last_seq), 0) from close_markers where trade_date = %(trade_date)s

-- name: previous_close_markers
-- Where each partition's previous trading day ended: the day starts right after it.
select kafka_partition, max(kafka_offset) from close_markers
where trade_date < %(trade_date)s
group by kafka_partition

-- name: partitions_ahead
-- The closing day's partition of `trades` and the next seven days' (sql/migrations/0023).
select ensure_trade_partitions(array(
  select d::date from generate_series(%(trade_date)s::date, %(trade_date)s::date + 7,
                                      interval '1 day') d))

-- name: partition_stats
-- Per partition: the day's trades, its distinct seqs, highest seq and first offset over the
-- trades and the cancels and corrections (they take seqs too), and the amendments.
select kafka_partition, count(*) filter (where not amend), count(distinct seq), max(seq),
       min(kafka_offset), count(*) filter (where amend)
from (select kafka_partition, seq, kafka_offset, false as amend from trades
      where trade_date = %(trade_date)s
      union all
      select kafka_partition, seq, kafka_offset, true from trade_amendments
      where trade_date = %(trade_date)s) d
group by kafka_partition

-- name: start_run
insert into settlement_runs (trade_date, source, source_reason, status, offsets, holder,
                             fencing_token, settlement_date, based_on_run, triggered_by)
values (%(trade_date)s, %(source)s, %(source_reason)s, 'running', %(offsets)s, %(holder)s,
        %(token)s, %(settlement_date)s, %(based_on_run)s, %(triggered_by)s)
returning run_id

-- name: finish_run
update settlement_runs
set status = %(status)s, trades = %(trades)s, duplicates_removed = %(duplicates_removed)s,
    malformed = %(malformed)s, positions = %(positions)s, accounts = %(accounts)s,
    gross_notional = %(gross_notional)s, netting_efficiency = %(netting_efficiency)s,
    timings = %(timings)s, error = %(error)s, finished_at = now()
where run_id = %(run_id)s and status = 'running'  -- not if a takeover abandoned it

-- name: complete_run
-- A published run's last record (its end and verdict committed with the publication): what
-- is still empty, filled.
update settlement_runs
set timings = coalesce(timings, %(timings)s), error = coalesce(error, %(error)s)
where run_id = %(run_id)s

-- name: record_validation
update settlement_runs
set validation_success = %(success)s, validation = %(validation)s,
    report_path = coalesce(%(report_path)s, report_path)
where run_id = %(run_id)s

-- A rerun replaces the date's rows: these deletes and the COPY of the new rows are one
-- transaction (never a bare insert that could double a day).
-- name: delete_positions
delete from positions where trade_date = %(trade_date)s

-- name: delete_cash_obligations
delete from cash_obligations where trade_date = %(trade_date)s

-- name: delete_instrument_summary
delete from instrument_summary where trade_date = %(trade_date)s

-- name: stored_positions
select trade_date, account, symbol, bought_qty, sold_qty, net_qty, buy_amount, sell_amount,
       net_cash, trade_count
from positions where trade_date = %(trade_date)s

-- name: latest_run_any
-- The newest run of the date whatever its outcome (or the run named): what the DAG reports
-- after spark-submit.
select run_id, status, source, source_reason, trades, validation_success, validation,
       report_path, error, published_at is not null, accepted_incomplete
from settlement_runs
where trade_date = %(trade_date)s and (%(run_id)s::bigint is null or run_id = %(run_id)s)
order by run_id desc
limit 1

-- name: settlement_partitions
-- The close's tables' partitions for the day's month and the month a week on, before a run's
-- results are staged into them (sql/migrations/0024): the next month is made ahead, by the
-- last week's closes of this one. A catalog lookup once they exist.
select ensure_settlement_partitions(array[%(trade_date)s::date, %(trade_date)s::date + 7])

-- Publication: the run's staged rows replace the date's published rows (the deletes above
-- run first, in the same transaction). The run's date, with its id, reads its month alone.
-- name: publish_positions
insert into positions
select trade_date, account, symbol, bought_qty, sold_qty, net_qty, buy_amount, sell_amount,
       net_cash, trade_count
from run_positions where trade_date = %(trade_date)s and run_id = %(run_id)s

-- name: publish_cash_obligations
insert into cash_obligations
select trade_date, account, buy_amount, sell_amount, net_cash, trade_count
from run_cash_obligations where trade_date = %(trade_date)s and run_id = %(run_id)s

-- name: publish_instrument_summary
insert into instrument_summary
select trade_date, symbol, trades, volume, notional, vwap, low_price, high_price, close_price
from run_instrument_summary where trade_date = %(trade_date)s and run_id = %(run_id)s

-- name: mark_published
insert into published_days (trade_date, run_id) values (%(trade_date)s, %(run_id)s)
on conflict (trade_date) do update set run_id = excluded.run_id, published_at = now()

-- name: record_publication
-- The day's next version (publications of a date are serialised: lock_publication).
update settlement_runs
set published_at = now(), accepted_incomplete = %(accepted_incomplete)s,
    version = coalesce((select max(o.version) from settlement_runs o
                        where o.trade_date = %(trade_date)s), 0) + 1
where run_id = %(run_id)s

-- name: published_run
select run_id from published_days where trade_date = %(trade_date)s

-- name: recorded_partitions
-- The topic's partition count as Kafka last reported it to a run of this date or before
-- (settlement_runs.offsets, written by start_run from the source choice).
select (offsets ->> 'topic_partitions')::int, run_id, trade_date
from settlement_runs
where trade_date <= %(trade_date)s and offsets ? 'topic_partitions'
order by trade_date desc, run_id desc
limit 1

-- name: hold_at_most
-- The publishing transaction's bounds, for this transaction only (pipeline.hold_at_most).
select set_config('idle_in_transaction_session_timeout', %(idle)s, true),
       set_config('tcp_keepalives_idle', %(probe)s, true),
       set_config('tcp_keepalives_interval', %(probe)s, true),
       set_config('tcp_keepalives_count', '3', true),
       set_config('tcp_user_timeout', %(user_timeout)s, true)

-- name: lock_publication
-- One publication of a date at a time (released at commit): the newest-run check and the
-- replacement of the rows are then one step.
select pg_advisory_xact_lock(hashtextextended('publish ' || %(trade_date)s::text, 0))

-- name: marker_offsets
-- Where each partition's close marker of the date sits in Kafka (a scheduled close settles a
-- day again only if a marker is newer than those its published run was chosen against).
select kafka_partition, max(kafka_offset) from close_markers
where trade_date = %(trade_date)s
group by kafka_partition

-- name: run_version
select version from settlement_runs where run_id = %(run_id)s

-- name: delta_size
-- How far a run's positions are from the published day's (the delta an operator approves):
-- the (account, symbol) lines that change, the accounts they touch, and the quantities and
-- cash moved (sums of absolute changes).
select count(*), count(distinct coalesce(n.account, o.account)),
       coalesce(sum(abs(coalesce(n.net_qty, 0) - coalesce(o.net_qty, 0))), 0),
       coalesce(sum(abs(coalesce(n.net_cash, 0) - coalesce(o.net_cash, 0))), 0)
from (select account, symbol, net_qty, net_cash from run_positions
      where trade_date = %(trade_date)s and run_id = %(run_id)s) n
full join (select account, symbol, net_qty, net_cash from positions
           where trade_date = %(trade_date)s) o
  on o.account = n.account and o.symbol = n.symbol
where coalesce(n.net_qty, 0) <> coalesce(o.net_qty, 0)
   or coalesce(n.net_cash, 0) <> coalesce(o.net_cash, 0)

-- name: held_run
-- A run kept for approval: of this date, finished, validated, not published.
select status, validation_success, published_at is not null, based_on_run, triggered_by
from settlement_runs
where run_id = %(run_id)s and trade_date = %(trade_date)s

-- name: held_reclose
-- A re-close of the date computed against the published run and held for approval: a second
-- re-close while it waits is refused with its id.
select r.run_id, r.triggered_by from settlement_runs r
join published_days p on p.trade_date = r.trade_date and p.run_id = r.based_on_run
where r.trade_date = %(trade_date)s and r.status = 'succeeded' and r.validation_success
  and r.published_at is null
  and not exists (select 1 from reclose_decisions d where d.run_id = r.run_id)
order by r.run_id desc
limit 1

-- name: record_decision
insert into reclose_decisions (run_id, trade_date, decision, decided_by, delta, outcome)
values (%(run_id)s, %(trade_date)s, %(decision)s, %(decided_by)s, %(delta)s, %(outcome)s)
returning decision_id
