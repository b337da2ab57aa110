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
