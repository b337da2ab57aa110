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
-- A published run's settlement date and version (the publishing transaction has numbered it).
select settlement_date, version from settlement_runs where run_id = %(run_id)s

-- name: previous_version
-- The publication of the date before the current one (the version the delta is against).
select r.run_id from settlement_runs r
where r.trade_date = %(trade_date)s and r.published_at is not null
  and r.run_id < %(run_id)s
order by r.run_id desc
limit 1

-- name: run_instructions
select instruction_id, trade_date::text, settlement_date::text, account, symbol, side,
       quantity, payment, amount, version, carried_from
from settlement_instructions where run_id = %(run_id)s
order by instruction_id

-- name: run_nets
select account, symbol, net_qty, net_cash from run_positions where run_id = %(run_id)s

-- name: open_fails
-- Fails left to carry, from settlement dates before this one: not yet taken by a run, or
-- taken by a run of this trade date that a later run superseded (the later run takes them).
select s.instruction_id, i.account, i.symbol, s.open_quantity, s.open_amount
from instruction_statuses s join settlement_instructions i using (instruction_id)
where (s.open_quantity <> 0 or s.open_amount <> 0)
  and i.settlement_date < %(settlement_date)s
  and (s.carried_into_run is null
       or s.carried_into_run in (select run_id from settlement_runs
                                 where trade_date = %(trade_date)s
                                   and run_id <> %(run_id)s))
order by s.instruction_id

-- name: insert_instruction
insert into settlement_instructions (instruction_id, run_id, trade_date, settlement_date,
    account, symbol, side, quantity, payment, amount, version, carried_from)
values (%(instruction_id)s, %(run_id)s, %(trade_date)s, %(settlement_date)s, %(account)s,
        %(symbol)s, %(side)s, %(quantity)s, %(payment)s, %(amount)s, %(version)s,
        %(carried_from)s)

-- name: carry
update instruction_statuses set carried_into_run = %(run_id)s
where instruction_id = any(%(ids)s)

-- name: for_status
-- The instructions an answer names, whether each is its date's current one, and any answer
-- already recorded.
select i.instruction_id, i.trade_date::text, i.settlement_date::text, i.account, i.symbol,
       i.side, i.quantity, i.payment, i.amount, i.version, i.carried_from,
       p.run_id is not distinct from i.run_id, s.status, s.settled_quantity
from settlement_instructions i
left join published_days p on p.trade_date = i.trade_date
left join instruction_statuses s using (instruction_id)
where i.instruction_id = any(%(ids)s)

-- name: insert_status
insert into instruction_statuses (instruction_id, status, settled_quantity, open_quantity,
                                  open_amount, source_file)
values (%(instruction_id)s, %(status)s, %(settled_quantity)s, %(open_quantity)s,
        %(open_amount)s, %(source_file)s)

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
select count(*) from instruction_statuses
where carried_into_run is null and (open_quantity <> 0 or open_amount <> 0)

-- name: members
-- The clearing member (participant) of each account the reference data maps.
select account, participant_id from participants where account = any(%(accounts)s)

-- name: carried_origins
-- The fails a set carried in: whose, and their own (first) settlement date.
select instruction_id, account, settlement_date from settlement_instructions
where instruction_id = any(%(ids)s)
