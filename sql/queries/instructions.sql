-- Named statements of the settlement instructions (settlement/instructions/store.py; tables
-- in migration 0011).

-- name: lock
-- One writer of instructions and statuses at a time (until commit): an open fail is then
-- carried into exactly one run's instructions.
select pg_advisory_xact_lock(hashtextextended('settlement instructions', 0))

-- name: published_run
select r.run_id, r.settlement_date, r.version
from published_days p join settlement_runs r on r.run_id = p.run_id
where p.trade_date = %(trade_date)s

-- name: run_settlement
-- A published run's settlement date and version (the publishing transaction has numbered it),
-- and the mode its instructions were written in (NULL: not written yet), and its date.
select settlement_date, version, instructions_mode, trade_date::text from settlement_runs
where run_id = %(run_id)s

-- name: set_mode
update settlement_runs set instructions_mode = %(mode)s where run_id = %(run_id)s

-- name: run_created
-- When a run's set was written: its messages' creation time.
select min(created_at) from settlement_instructions where run_id = %(run_id)s
  and kind <> 'delta'

-- name: previous_version
-- The publication of the date before the current one (the version the delta is against).
select r.run_id from settlement_runs r
where r.trade_date = %(trade_date)s and r.published_at is not null
  and r.run_id < %(run_id)s
order by r.run_id desc
limit 1

-- name: run_instructions
select instruction_id, trade_date::text, settlement_date::text, account, symbol, side,
       quantity, payment, amount, version, carried_from, kind, links
from settlement_instructions where run_id = %(run_id)s and kind <> 'delta'
order by instruction_id

-- name: run_delta
-- The delta stored for a run (`settle instructions --delta`), if one was written.
select instruction_id, trade_date::text, settlement_date::text, account, symbol, side,
       quantity, payment, amount, version, carried_from, kind, links
from settlement_instructions where run_id = %(run_id)s and kind = 'delta'
order by instruction_id

-- name: run_nets
-- With the run's date: run_positions is partitioned by month and keyed (trade_date, run_id,
-- ...), so by the run id alone this probed every month's key, skipping through its dates.
select account, symbol, net_qty, net_cash from run_positions
where trade_date = %(trade_date)s and run_id = %(run_id)s

-- name: open_fails
-- Fails left to carry, from settlement dates before this one: not yet taken by a run, or
-- taken by a run of this trade date that a later run superseded (the later run takes them).
-- A custodian-mode instruction's fail stays pending with the agent: never carried.
select s.instruction_id, i.account, i.symbol, s.open_quantity, s.open_amount
from instruction_statuses s join settlement_instructions i using (instruction_id)
join settlement_runs r on r.run_id = i.run_id
where (s.open_quantity <> 0 or s.open_amount <> 0)
  and r.instructions_mode is distinct from 'custodian'
  and i.kind in ('instruct', 'delta', 'carry')
  and i.settlement_date < %(settlement_date)s
  and (s.carried_into_run is null
       or s.carried_into_run in (select run_id from settlement_runs
                                 where trade_date = %(trade_date)s
                                   and run_id <> %(run_id)s))
order by s.instruction_id

-- name: carry
update instruction_statuses set carried_into_run = %(run_id)s
where instruction_id = any(%(ids)s)

-- name: for_status
-- The instructions an answer names, whether each is its date's current one, any answer
-- already recorded, the mode it was written in and the cancellation sent for it, if any.
select i.instruction_id, i.trade_date::text, i.settlement_date::text, i.account, i.symbol,
       i.side, i.quantity, i.payment, i.amount, i.version, i.carried_from, i.kind, i.links,
       p.run_id is not distinct from i.run_id
       -- or a delta from it was written: the agent holds it (ccp)
       or exists (select 1 from settlement_instructions d
                  where d.kind = 'delta' and d.trade_date = i.trade_date
                    and d.run_id > i.run_id),
       s.status, s.settled_quantity,
       r.instructions_mode,
       (select min(c.instruction_id) from settlement_instructions c
        where c.kind = 'cancel' and c.links = i.instruction_id)
from settlement_instructions i
join settlement_runs r on r.run_id = i.run_id
left join published_days p on p.trade_date = i.trade_date
left join instruction_statuses s using (instruction_id)
where i.instruction_id = any(%(ids)s)

-- name: insert_status
insert into instruction_statuses (instruction_id, status, settled_quantity, open_quantity,
                                  open_amount, source_file)
values (%(instruction_id)s, %(status)s, %(settled_quantity)s, %(open_quantity)s,
        %(open_amount)s, %(source_file)s)

-- name: update_status
-- Custodian mode: a pending instruction answered again (settled at last, or more of it).
update instruction_statuses
set status = %(status)s, settled_quantity = %(settled_quantity)s,
    open_quantity = %(open_quantity)s, open_amount = %(open_amount)s,
    reported_at = now(), source_file = %(source_file)s
where instruction_id = %(instruction_id)s

-- name: insert_answer
insert into instruction_answers (instruction_id, status, settled_quantity, source_file,
                                 file_line)
values (%(instruction_id)s, %(status)s, %(settled_quantity)s, %(source_file)s, %(line)s)

-- name: standing
-- Custodian mode: a trade date's instructions from its earlier runs that no cancellation
-- took back, each with what of it is still pending (signed; all of it until answered).
select i.instruction_id, i.trade_date::text, i.settlement_date::text, i.account, i.symbol,
       i.side, i.quantity, i.payment, i.amount, i.version, i.carried_from, i.kind, i.links,
       coalesce(s.open_quantity, case i.side when 'RECE' then i.quantity
                                             when 'DELI' then -i.quantity else 0 end),
       coalesce(s.open_amount, case i.payment when 'RECV' then i.amount
                                              when 'PAY' then -i.amount else 0 end)
from settlement_instructions i
left join instruction_statuses s using (instruction_id)
where i.trade_date = %(trade_date)s and i.run_id <> %(run_id)s and i.kind = 'instruct'
  and not exists (select 1 from settlement_instructions c
                  where c.kind = 'cancel' and c.links = i.instruction_id)
order by i.instruction_id

-- name: pending
-- Custodian mode: failed instructions (and the rest of partials) still pending with the
-- agent, oldest intended settlement date first.
select i.instruction_id, i.trade_date::text, i.settlement_date::text, i.account, i.symbol,
       i.side, s.status, s.settled_quantity, s.open_quantity, s.open_amount
from instruction_statuses s
join settlement_instructions i using (instruction_id)
join settlement_runs r on r.run_id = i.run_id
where r.instructions_mode = 'custodian' and i.kind = 'instruct'
  and (s.open_quantity <> 0 or s.open_amount <> 0)
  and not exists (select 1 from settlement_instructions c
                  where c.kind = 'cancel' and c.links = i.instruction_id)
order by i.settlement_date, i.instruction_id

-- name: fail_share
-- Per settlement date: the current instructions and how many were answered failed or
-- settled in part.
select i.settlement_date::text, max(i.trade_date)::text, count(*),
       count(*) filter (where s.open_quantity <> 0 or s.open_amount <> 0)
from settlement_instructions i
join published_days p on p.trade_date = i.trade_date and p.run_id = i.run_id
left join instruction_statuses s using (instruction_id)
where i.settlement_date = any(%(dates)s::date[])
group by i.settlement_date
order by i.settlement_date

-- name: carried_out
-- The fails of a run's instructions, and into which run each went.
select s.instruction_id, i.account, i.symbol, s.status, s.open_quantity, s.open_amount,
       s.carried_into_run
from instruction_statuses s join settlement_instructions i using (instruction_id)
where i.run_id = %(run_id)s and (s.open_quantity <> 0 or s.open_amount <> 0)
order by s.instruction_id

-- name: open_fail_count
-- Fails not yet carried (ccp) or still pending with the agent (custodian), less those a
-- re-close cancelled.
select count(*) from instruction_statuses s
where s.carried_into_run is null and (s.open_quantity <> 0 or s.open_amount <> 0)
  and not exists (select 1 from settlement_instructions c
                  where c.kind = 'cancel' and c.links = s.instruction_id)

-- name: members
-- The clearing member (participant) of each account the reference data maps.
select account, participant_id from participants where account = any(%(accounts)s)

-- name: carried_origins
-- The fails a set carried in: whose, and when each open position was first due (its mark's
-- record; a set written before marks were kept: the fail's own settlement date).
select i.instruction_id, i.account, coalesce(m.first_settlement_date, i.settlement_date)
from settlement_instructions i
left join instruction_marks m on m.instruction_id = i.instruction_id
                             and m.run_id = %(run_id)s
where i.instruction_id = any(%(ids)s)

-- name: run_marks
-- The marks of the open positions a run's set carried in, per account (ccp mode).
select account, sum(mark) from instruction_marks where run_id = %(run_id)s group by account

-- name: mark_prices
-- The closing price each symbol is marked at in a run's set: the close of the run's own
-- trade date, else the latest one published before it (NULL: never traded here).
select s.symbol, coalesce(c.close_price, p.close_price),
       case when c.close_price is not null then %(trade_date)s::date else p.trade_date end
from unnest(%(symbols)s::text[]) as s(symbol)
left join run_instrument_summary c on c.trade_date = %(trade_date)s and c.run_id = %(run_id)s
                                  and c.symbol = s.symbol
left join lateral (select close_price, trade_date from instrument_summary
                   where symbol = s.symbol and trade_date < %(trade_date)s
                     and close_price is not null
                   order by trade_date desc limit 1) p on true

-- name: fail_origins
-- When each fail's open position was first due: its own settlement date, or earlier when
-- its line carried older fails in (their marks keep theirs).
select i.instruction_id, i.settlement_date,
       least(i.settlement_date,
             (select min(m.first_settlement_date) from instruction_marks m
              where m.run_id = i.run_id
                and m.instruction_id = any(string_to_array(i.carried_from, ';'))))
from settlement_instructions i where i.instruction_id = any(%(ids)s)

-- name: insert_mark
insert into instruction_marks (run_id, instruction_id, account, symbol, quantity,
    carried_amount, close_price, price_date, marked_amount, mark, first_settlement_date,
    age_days)
values (%(run_id)s, %(instruction_id)s, %(account)s, %(symbol)s, %(quantity)s,
        %(carried_amount)s, %(close_price)s, %(price_date)s, %(marked_amount)s, %(mark)s,
        %(first_settlement_date)s, %(age_days)s)

-- name: next_set
-- The earliest written ccp set of a later settlement date (a fail answered after it was
-- written is carried into it at once), with how many late carries it has already.
select r.run_id, r.trade_date::text, r.settlement_date::text, r.version,
       (select count(*) from settlement_instructions c
        where c.run_id = r.run_id and c.kind = 'carry')
from published_days p join settlement_runs r on r.run_id = p.run_id
where r.instructions_mode = 'ccp' and r.settlement_date > %(settlement_date)s
order by r.settlement_date, r.trade_date
limit 1
