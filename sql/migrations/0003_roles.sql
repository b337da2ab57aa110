-- Least privilege. Group roles (NOLOGIN) that deployments grant to their login users:
--   settle_site        a consumer site: writes its ledger tables, nothing else
--   settle_settlement  the end-of-day job: reads the ledgers, writes the settlement tables
--   settle_auditor     reads everything, writes nothing
-- Roles are cluster-wide, so they are created only if missing; grants are per database.

do $$
begin
    if not exists (select 1 from pg_roles where rolname = 'settle_site') then
        create role settle_site nologin;
    end if;
    if not exists (select 1 from pg_roles where rolname = 'settle_settlement') then
        create role settle_settlement nologin;
    end if;
    if not exists (select 1 from pg_roles where rolname = 'settle_auditor') then
        create role settle_auditor nologin;
    end if;
end
$$;

revoke all on all tables in schema public from public;

grant usage on schema public to settle_site, settle_settlement, settle_auditor;

-- Sites: their ledger tables. TEMP for the COPY staging table.
grant select, insert, update on trades, dead_letters, consumer_offsets, close_markers,
    site_heartbeats, ingest_batches to settle_site;
grant usage on sequence site_heartbeats_id_seq, ingest_batches_id_seq to settle_site;

-- Settlement: read the ledgers, write results and runs.
grant select on trades, dead_letters, consumer_offsets, close_markers, site_heartbeats,
    ingest_batches to settle_settlement;
grant select, insert, update, delete on positions, cash_obligations, instrument_summary,
    settlement_runs, audit_reports to settle_settlement;
grant usage on sequence settlement_runs_run_id_seq to settle_settlement;

-- Auditors: read only.
grant select on all tables in schema public to settle_auditor;

-- The site's COPY staging table is a temporary table.
do $$
begin
    execute format('grant temporary on database %I to settle_site', current_database());
end
$$;
