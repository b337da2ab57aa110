-- Named statements of the consumer sites (consumers/ledger.py). %(name)s parameters.

-- name: create_stage
-- Per-connection staging table for COPY; emptied at every commit.
create temp table if not exists trades_stage
    (like trades including defaults excluding constraints)
    on commit delete rows

-- name: claim_partitions
-- A partition without a stored position starts from the beginning (-1).
insert into consumer_offsets (consumer_group, topic, kafka_partition, next_offset, site)
select %(group)s, %(topic)s, p, -1, %(site)s from unnest(%(partitions)s::int[]) as p
on conflict do nothing

-- name: read_offsets
select kafka_partition, next_offset from consumer_offsets
where consumer_group = %(group)s and topic = %(topic)s
  and kafka_partition = any(%(partitions)s::int[])

-- name: read_positions
select kafka_partition, next_offset, site from consumer_offsets
where consumer_group = %(group)s and topic = %(topic)s
  and kafka_partition = any(%(partitions)s::int[])

-- name: lock_offsets
-- Row locks serialise two sites that both believe they own a partition (a paused zombie
-- and its successor); the caller compares what it reads with what it expects.
select kafka_partition, next_offset from consumer_offsets
where consumer_group = %(group)s and topic = %(topic)s
  and kafka_partition = any(%(partitions)s::int[])
order by kafka_partition
for update

-- name: store_offsets
update consumer_offsets o
set next_offset = v.next_offset, site = %(site)s, updated_at = now()
from unnest(%(partitions)s::int[], %(next_offsets)s::bigint[]) as v (kafka_partition, next_offset)
where o.consumer_group = %(group)s and o.topic = %(topic)s
  and o.kafka_partition = v.kafka_partition

-- name: new_staged_days
-- The staged trade dates not among those the site knows to have their partition of `trades`.
select array_agg(distinct trade_date) from trades_stage
where trade_date <> all (%(known)s::date[])

-- name: ensure_partitions
-- Each day's partition of `trades` (sql/migrations/0023), created if missing.
select ensure_trade_partitions(%(days)s::date[])

-- name: insert_staged
-- A trade id goes into the registry (trade_ids, the idempotency key across all days) and the
-- copy the registry kept into `trades`, in one statement. When a replay and its original land
-- in one batch, the first staged row (the lower offset: a trade's copies share its symbol
-- key, hence one partition, and COPY keeps consumption order in a fresh temp table's heap)
-- wins; no ORDER BY, so no sort per batch.
with kept as (
  insert into trade_ids (trade_id, trade_date, kafka_partition, kafka_offset)
  select trade_id, trade_date, kafka_partition, kafka_offset from trades_stage
  on conflict (trade_id) do nothing
  returning kafka_partition, kafka_offset)
insert into trades (trade_id, trade_date, seq, kafka_partition, kafka_offset, symbol, price,
                    quantity, buyer, seller, executed_at, site)
select s.trade_id, s.trade_date, s.seq, s.kafka_partition, s.kafka_offset, s.symbol, s.price,
       s.quantity, s.buyer, s.seller, s.executed_at, s.site
from trades_stage s
join kept k on k.kafka_partition = s.kafka_partition and k.kafka_offset = s.kafka_offset

-- name: insert_staged_new
-- insert_staged when no staged trade is stored yet nor staged twice (consumers.ledger tries it
-- first after a batch without replays): any replay fails it on trade_ids_pkey.
with ids as (
  insert into trade_ids (trade_id, trade_date, kafka_partition, kafka_offset)
  select trade_id, trade_date, kafka_partition, kafka_offset from trades_stage)
insert into trades (trade_id, trade_date, seq, kafka_partition, kafka_offset, symbol, price,
                    quantity, buyer, seller, executed_at, site)
select trade_id, trade_date, seq, kafka_partition, kafka_offset, symbol, price,
       quantity, buyer, seller, executed_at, site
from trades_stage

-- name: late_staged
-- Staged trades whose day had already closed on their partition: the close marker of
-- (trade_date, partition) sits at a lower offset. Exact across restarts and takeovers, since
-- the markers are in the ledger, committed with the offsets that passed them (and this
-- batch's own markers are inserted before this runs).
select s.kafka_partition, s.kafka_offset, s.trade_date, m.kafka_offset
from trades_stage s
join close_markers m on m.trade_date = s.trade_date and m.kafka_partition = s.kafka_partition
where s.kafka_offset > m.kafka_offset

-- name: drop_staged
delete from trades_stage s
using unnest(%(partitions)s::int[], %(offsets)s::bigint[]) as d (kafka_partition, kafka_offset)
where s.kafka_partition = d.kafka_partition and s.kafka_offset = d.kafka_offset

-- name: insert_staged_subset
-- insert_staged for some staged rows only (narrowing down a refused batch), in batch order so
-- that the first copy of a replayed trade still wins.
with kept as (
  insert into trade_ids (trade_id, trade_date, kafka_partition, kafka_offset)
  select s.trade_id, s.trade_date, s.kafka_partition, s.kafka_offset
  from unnest(%(partitions)s::int[], %(offsets)s::bigint[]) with ordinality
       as k (kafka_partition, kafka_offset, n)
  join trades_stage s on s.kafka_partition = k.kafka_partition
                     and s.kafka_offset = k.kafka_offset
  order by k.n
  on conflict (trade_id) do nothing
  returning kafka_partition, kafka_offset)
insert into trades (trade_id, trade_date, seq, kafka_partition, kafka_offset, symbol, price,
                    quantity, buyer, seller, executed_at, site)
select s.trade_id, s.trade_date, s.seq, s.kafka_partition, s.kafka_offset, s.symbol, s.price,
       s.quantity, s.buyer, s.seller, s.executed_at, s.site
from trades_stage s
join kept k on k.kafka_partition = s.kafka_partition and k.kafka_offset = s.kafka_offset

-- name: insert_dead_letter
insert into dead_letters (topic, kafka_partition, kafka_offset, raw, reason, site, trade_date)
values (%(topic)s, %(partition)s, %(offset)s, %(raw)s, %(reason)s, %(site)s, %(trade_date)s)
on conflict do nothing

-- name: insert_close_marker
-- A row back when the marker is new; none when the day's partition already has one.
insert into close_markers (trade_date, kafka_partition, last_seq, kafka_offset, site)
values (%(trade_date)s, %(partition)s, %(last_seq)s, %(offset)s, %(site)s)
on conflict do nothing
returning 1

-- name: stored_close_marker
select last_seq, kafka_offset from close_markers
where trade_date = %(trade_date)s and kafka_partition = %(partition)s

-- name: conflicting_staged
-- Staged copies that were not kept (the registry holds the trade id from another offset) and
-- whose content differs from the kept copy's: conflicting replays, not duplicates. Typed
-- equality, so 10.5 = 10.50 and equal instants in other zones are the same trade, as in
-- consumers.parse.fingerprint. A copy of another trade date conflicts by the registry alone
-- (the kept copy's day may be archived); one of the same date is compared with the kept row,
-- looked up in its day's partition. The lookup is a LATERAL ... LIMIT 1, which PostgreSQL
-- cannot turn into a join: as a plain join it was planned as a hash join over every day's
-- partition (251 days of 20,000 trades: 0.66 s a batch against 0.016 s; with 250 days of
-- 200,000, ingest fell to 3,914 trades/s in benchmarks/history.py). Runs only when a batch
-- had replays.
select s.kafka_partition, s.kafka_offset, s.trade_id, r.kafka_partition, r.kafka_offset
from trades_stage s
join trade_ids r on r.trade_id = s.trade_id
left join lateral (
  select k.seq, k.symbol, k.price, k.quantity, k.buyer, k.seller, k.executed_at from trades k
  where k.trade_date = r.trade_date and k.trade_id = r.trade_id
  limit 1) t on true
where (s.kafka_partition, s.kafka_offset) <> (r.kafka_partition, r.kafka_offset)
  and (s.trade_date <> r.trade_date
       or (s.seq, s.symbol, s.price, s.quantity, s.buyer, s.seller, s.executed_at)
          is distinct from
          (t.seq, t.symbol, t.price, t.quantity, t.buyer, t.seller, t.executed_at))

-- name: insert_batch
insert into ingest_batches (site, messages, inserted, duplicates, dead_letters, close_markers,
                            partitions, duration_ms)
values (%(site)s, %(messages)s, %(inserted)s, %(duplicates)s, %(dead_letters)s,
        %(close_markers)s, %(partitions)s, %(duration_ms)s)

-- name: heartbeat
insert into site_heartbeats (site, scheme, partitions, trades_total)
values (%(site)s, %(scheme)s, %(partitions)s, %(trades_total)s)

-- name: prune_heartbeats
-- Heartbeat retention (SETTLE_HEARTBEAT_RETENTION_DAYS): one row per site per second would
-- otherwise grow without bound. Every site's old beats, so a retired site's go too.
delete from site_heartbeats where beat_at < now() - make_interval(days => %(days)s)

-- name: closed_partitions
select count(*) from close_markers where trade_date = %(trade_date)s

-- name: current_day
-- The day the sites are working on, for `site run --until-close` without --date and for
-- `settle status`: the newest trade date with trades or close markers up to a week after
-- today. A trade dated far ahead (the contract accepts up to 2099) must not pin it; only
-- when every date is that far ahead (a simulated future day) is the newest one taken.
select coalesce(
  greatest((select max(trade_date) from trades where trade_date <= current_date + 7),
           (select max(trade_date) from close_markers where trade_date <= current_date + 7)),
  greatest((select max(trade_date) from trades), (select max(trade_date) from close_markers)))

-- name: lock_offset
-- One partition's stored position, locked (repositioning after a retention gap).
select next_offset from consumer_offsets
where consumer_group = %(group)s and topic = %(topic)s and kafka_partition = %(partition)s
for update

-- name: insert_data_loss
insert into data_loss_events (topic, kafka_partition, from_offset, to_offset, site)
values (%(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(site)s)
on conflict do nothing

-- name: move_offset
update consumer_offsets set next_offset = %(next_offset)s, site = %(site)s, updated_at = now()
where consumer_group = %(group)s and topic = %(topic)s and kafka_partition = %(partition)s

-- name: amended_trade
-- What an amendment is checked against (consumers.parse.amendment_refusal): the trade, where
-- it is, its current version and whether it is cancelled. The registry answers where (and
-- one lookup, not one per day's partition), and its date finds the month's amendments.
select t.trade_date, t.kafka_partition, t.kafka_offset,
       coalesce((select max(a.version) from trade_amendments a
                 where a.trade_date = t.trade_date and a.trade_id = t.trade_id
                   and a.kind = 'correct'), 1),
       exists (select 1 from trade_amendments a
               where a.trade_date = t.trade_date and a.trade_id = t.trade_id
                 and a.kind = 'cancel')
from trade_ids t where t.trade_id = %(trade_id)s

-- name: amendment_copy
-- The kept amendment of this identity, and whether the new copy equals it in typed terms (a
-- replay) or not (a conflicting replay).
select kafka_partition, kafka_offset,
       (seq, reason, symbol, price, quantity, buyer, seller, executed_at) is not distinct from
       (%(seq)s::bigint, %(reason)s::text, %(symbol)s::text, %(price)s::numeric,
        %(quantity)s::bigint, %(buyer)s::text, %(seller)s::text, %(executed_at)s::timestamptz)
from trade_amendments
where trade_id = %(trade_id)s and kind = %(kind)s and coalesce(version, 0) = %(version_key)s

-- name: insert_amendment
insert into trade_amendments (trade_id, trade_date, seq, kafka_partition, kafka_offset, kind,
                              version, reason, symbol, price, quantity, buyer, seller,
                              executed_at, site, amended)
values (%(trade_id)s, %(trade_date)s, %(seq)s, %(partition)s, %(offset)s, %(kind)s,
        %(version)s, %(reason)s, %(symbol)s, %(price)s, %(quantity)s, %(buyer)s, %(seller)s,
        %(executed_at)s, %(site)s, %(amended)s)

-- name: amended_markers
-- The amended close markers kept for a day's partition, in order (consumers.parse
-- amended_marker_refusal).
select amended, last_seq, kafka_offset from amended_close_markers
where trade_date = %(trade_date)s and kafka_partition = %(partition)s
order by amended

-- name: insert_amended_marker
insert into amended_close_markers (trade_date, kafka_partition, amended, last_seq,
                                   kafka_offset, site)
values (%(trade_date)s, %(partition)s, %(amended)s, %(last_seq)s, %(offset)s, %(site)s)

-- name: hold_late_amendment
-- A cancel or correction after its day's close: held until an amended close decides it.
insert into late_amendments (topic, kafka_partition, kafka_offset, trade_date, kind, seq, raw,
                             site)
values (%(topic)s, %(partition)s, %(offset)s, %(trade_date)s, %(kind)s, %(seq)s, %(raw)s,
        %(site)s)
on conflict do nothing

-- name: held_amendments
-- What an amended close marker may decide: the day's held amendments on its partition before
-- it, not yet decided, in offset order.
select kafka_offset, kind, seq, raw from late_amendments
where topic = %(topic)s and trade_date = %(trade_date)s and kafka_partition = %(partition)s
  and kafka_offset < %(offset)s and amended is null
order by kafka_offset

-- name: decide_late_amendment
update late_amendments set amended = %(amended)s, verdict = %(verdict)s
where topic = %(topic)s and kafka_partition = %(partition)s and kafka_offset = %(offset)s
  and amended is null
