-- One close per trade date across both sites (issue 24).
--
-- A close (settle eod, the spark-submit job, the DAG's task) holds for its whole run a
-- session-level advisory lock on a connection of its own, which the server releases the
-- moment that session ends (the process died, its connection was cut), and this row, which
-- names it and carries a fencing token from a sequence: every new holder gets a larger one,
-- and a publication commits only if the row still holds the publisher's token. The holder
-- renews expires_at; a holder that stops renewing (paused, its host gone while the server
-- still sees the connection) has its lease session ended by the next close after expiry.

create sequence close_lease_tokens;

create table close_leases (
    trade_date   date        primary key,
    token        bigint      not null,
    run_id       bigint      references settlement_runs (run_id),
    holder       text        not null,   -- host, pid and site of the close
    backend_pid  integer     not null,   -- the lease session: what an expired lease ends
    acquired_at  timestamptz not null default now(),
    renewed_at   timestamptz not null default now(),
    expires_at   timestamptz not null,
    released_at  timestamptz           -- null while held; set by the holder when it is done
);

-- A close taken over is neither succeeded nor failed: it stopped (killed, paused past its
-- lease, cut off) and another close of the date carried on.
alter table settlement_runs drop constraint settlement_runs_status_check;
alter table settlement_runs add constraint settlement_runs_status_check
    check (status in ('running', 'succeeded', 'failed', 'abandoned'));
alter table settlement_runs
    add column holder text,
    add column fencing_token bigint;

-- Ending another session needs membership in its role (or pg_signal_backend, which could
-- end anyone's). This ends exactly one kind of session: the lease session of the date's
-- close, once its lease has expired.
create function end_expired_close(d date) returns boolean
language plpgsql security definer set search_path = pg_catalog, public as $$
declare
    holder_pid integer;
begin
    select l.backend_pid into holder_pid from public.close_leases l
    where l.trade_date = d and l.released_at is null and l.expires_at < now();
    if holder_pid is null then
        return false;
    end if;
    return coalesce((select pg_terminate_backend(a.pid) from pg_stat_activity a
                     where a.pid = holder_pid and a.application_name like 'settle-close %'),
                    false);
end
$$;
revoke all on function end_expired_close(date) from public;

grant select, insert, update on close_leases to settle_settlement;
grant usage on sequence close_lease_tokens to settle_settlement;
grant execute on function end_expired_close(date) to settle_settlement;
grant select on close_leases to settle_auditor;
