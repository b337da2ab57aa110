-- The instrument's closing price (issue 59): the price of the day's last trade by
-- (executed_at, trade_id), kept with the instrument summary. A clearing house marks its open
-- positions (fails carried) to it. NULL in rows published before it was kept.
-- Runnable with psql as is.
alter table instrument_summary add column close_price numeric(18, 4);
alter table run_instrument_summary add column close_price numeric(18, 4);
