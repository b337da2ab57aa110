-- Named reads of what a ledger recorded about a trade date beyond its trades: late trades and
-- retention gaps (the audit report and validation). %(name)s parameters.

-- name: late_trades
-- Trades for the day that arrived after the day's close marker on their partition.
select kafka_partition, count(*) from dead_letters
where topic = %(topic)s and trade_date = %(trade_date)s and reason like 'late:%%'
group by kafka_partition order by kafka_partition

-- name: data_loss_for_day
-- Retention gaps that may have cut the day. The day spans, on each partition, the offsets
-- after the previous day's close marker up to its own; a bound this ledger does not know is
-- open, so a gap is never ruled out for lack of a marker. Lost offsets: [from, to).
select e.kafka_partition, e.from_offset, e.to_offset, e.site, e.detected_at
from data_loss_events e
left join close_markers d
       on d.trade_date = %(trade_date)s and d.kafka_partition = e.kafka_partition
where e.topic = %(topic)s
  and (d.kafka_offset is null or e.from_offset <= d.kafka_offset)
  and e.to_offset > coalesce((select max(p.kafka_offset) from close_markers p
                              where p.kafka_partition = e.kafka_partition
                                and p.trade_date < %(trade_date)s), -1) + 1
order by e.kafka_partition, e.from_offset

-- name: day_figures
-- The day's checksums per bucket (settlement/spark/figures.py computes the same figures
-- in Spark, and the same row hash in Python for the Kafka classifier): the trade count and
-- the sums of the two 32-bit halves of a 64-bit hash of each trade's canonical row: its
-- fields as text joined by the unit separator (chr(31), which no text field may hold), the
-- date as days since 1970-01-01, the price in 1/10,000, executed_at in microseconds since the
-- epoch; hashed with md5 and cut to its first 8 bytes.
select kafka_partition, bucket, count(*) as trades,
       sum(('x' || substr(h, 1, 8))::bit(32)::bigint) as row_hi,
       sum(('x' || substr(h, 9, 8))::bit(32)::bigint) as row_lo
from (select kafka_partition, seq / %(bucket_seqs)s as bucket,
             md5(concat_ws(chr(31), trade_id, trade_date - date '1970-01-01', seq,
                           kafka_partition, symbol, (price * 10000)::bigint, quantity, buyer,
                           seller, (extract(epoch from executed_at) * 1000000)::bigint)) as h
      from trades
      where trade_date = %(trade_date)s) t
group by kafka_partition, bucket
