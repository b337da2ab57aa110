-- The monitoring login's group (issue 46): the PostgreSQL exporter reads the server's
-- statistics (pg_monitor: replication, connections, transactions) and, for the close's
-- progress on the dashboard and the deadline alert, the runs and the published days. It
-- reads no trade, position or instruction. Roles are cluster-wide: created only if missing.
-- Runnable with psql as is.
do $$
begin
    if not exists (select 1 from pg_roles where rolname = 'settle_monitoring') then
        create role settle_monitoring nologin;
    end if;
end
$$;

grant pg_monitor to settle_monitoring;
grant usage on schema public to settle_monitoring;
grant select on settlement_runs, published_days to settle_monitoring;
