-- Least privilege for real (issue 17): each role may do its work and nothing wider.
-- Runnable with psql as is.

-- Sites append. History (trades, dead letters, close markers, batches, heartbeats) is never
-- rewritten; the offset compare-and-set on consumer_offsets is the one UPDATE a site needs
-- (and SELECT ... FOR UPDATE on it needs that privilege too). Old heartbeats are still
-- deleted by retention (0006).
revoke update on trades, dead_letters, close_markers, ingest_batches, site_heartbeats
    from settle_site;

-- The audit trail is append-only for everyone but the admin: the end of day may not delete
-- a run or a report, nor rewrite a report.
revoke delete on settlement_runs, audit_reports from settle_settlement;
revoke update on audit_reports from settle_settlement;

-- A run's row is written in stages (started, finished, validated, published), so the end of
-- day keeps UPDATE on settlement_runs; grants cannot say "only the stages", this trigger
-- does: while a run is running it may be finished; once finished, a column may only be
-- filled in where it was empty (the validation and publication records), never changed.
-- Superusers (the admin) are exempt, for repairs done by hand.
create function settlement_runs_append_only() returns trigger
language plpgsql as $$
declare
    old_row jsonb := to_jsonb(old);
    new_row jsonb := to_jsonb(new);
    col text;
begin
    if (select rolsuper from pg_roles where rolname = current_user) then
        return new;
    end if;
    if new.run_id <> old.run_id or new.trade_date <> old.trade_date
       or new.started_at <> old.started_at or new.source <> old.source then
        raise exception 'settlement_runs is append-only: run % keeps its identity', old.run_id
            using errcode = 'insufficient_privilege';
    end if;
    if old.status = 'running' then
        return new;
    end if;
    for col in select jsonb_object_keys(old_row) loop
        if old_row -> col <> 'null'::jsonb and old_row -> col is distinct from new_row -> col
        then
            raise exception 'settlement_runs is append-only: run % is finished, its % is '
                            'recorded', old.run_id, col
                using errcode = 'insufficient_privilege';
        end if;
    end loop;
    return new;
end
$$;

create trigger settlement_runs_append_only before update on settlement_runs
    for each row execute function settlement_runs_append_only();
