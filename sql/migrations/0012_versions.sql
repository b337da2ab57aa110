-- A published day's versions (issue 45): every publication of a trade date is its next
-- version (a rerun, a re-close), numbered in the publishing transaction, which is serialised
-- per date (eod.sql lock_publication). The earlier versions stay readable: their runs' rows
-- are kept in run_positions, and the view below names them by version.
-- Runnable with psql as is.

alter table settlement_runs add column version integer check (version >= 1);

-- Runs published before this migration, in the order they published.
update settlement_runs r set version = v.n
from (select run_id, row_number() over (partition by trade_date order by published_at, run_id) n
      from settlement_runs where published_at is not null) v
where v.run_id = r.run_id;

create unique index settlement_runs_date_version on settlement_runs (trade_date, version)
    where version is not null;

-- Each version's positions, the current one and every earlier one.
create view positions_by_version as
select r.trade_date, r.version, r.run_id, r.published_at, r.settlement_date,
       p.account, p.symbol, p.bought_qty, p.sold_qty, p.net_qty, p.buy_amount,
       p.sell_amount, p.net_cash, p.trade_count,
       r.run_id = d.run_id as current
from settlement_runs r
join run_positions p on p.run_id = r.run_id
left join published_days d on d.trade_date = r.trade_date
where r.version is not null;

grant select on positions_by_version to settle_settlement, settle_auditor;
