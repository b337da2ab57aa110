-- The close lease after a security review (issue 42). Runnable with psql as is.
--
-- 1. end_expired_close (0008) ran as the migrating superuser, read pg_stat_activity through a
--    search_path in which the caller's temporary schema came first, and ended whatever pid an
--    expired lease row named: a caller could make it end any session of the cluster. It now
--    runs as a role that is no superuser and may only signal backends (pg_signal_backend: it
--    cannot end a superuser's session at all), looks names up in pg_catalog with pg_temp
--    last, and ends a session only if it is a close of the settlement role that holds the
--    date's advisory lock.
-- 2. It skips a lease row that is locked: the publishing transaction holds it (the fence),
--    so a close that is publishing is never judged expired, however long it publishes.
-- 3. Liveness is the date's advisory lock held by the lease session, never a bare pid that a
--    new session may carry after a restart.
-- 4. TEMP on the database is a PUBLIC default: only the sites need it (their COPY stage).

-- The date's advisory lock key, one definition for the lease's SQL and the checks below
-- (to_char: a cast to text would follow the session's DateStyle).
create function close_lease_key(d date) returns bigint
language sql stable set search_path = pg_catalog, pg_temp as $$
    select pg_catalog.hashtextextended('close ' || pg_catalog.to_char(d, 'YYYY-MM-DD'), 0)
$$;

-- Whether session ``holder`` holds the date's close lock in this database (pg_locks shows a
-- bigint advisory key as its high and low 32 bits, objsubid 1).
create function close_lock_held(d date, holder integer) returns boolean
language sql stable set search_path = pg_catalog, pg_temp as $$
    select exists (
        select 1 from pg_catalog.pg_locks k
        where k.locktype = 'advisory' and k.granted and k.pid = holder and k.objsubid = 1
          and k.database = (select b.oid from pg_catalog.pg_database b
                            where b.datname = pg_catalog.current_database())
          and k.classid = ((public.close_lease_key(d) >> 32) & 4294967295)::oid
          and k.objid = (public.close_lease_key(d) & 4294967295)::oid)
$$;

do $$
begin
    if not exists (select 1 from pg_roles where rolname = 'settle_close_reaper') then
        create role settle_close_reaper nologin;
    end if;
end
$$;
grant pg_signal_backend to settle_close_reaper;
grant usage on schema public to settle_close_reaper;
-- UPDATE for the row lock (FOR UPDATE SKIP LOCKED), never used to write.
grant select, update on close_leases to settle_close_reaper;

create or replace function end_expired_close(d date) returns boolean
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    holder_pid integer;
begin
    select l.backend_pid into holder_pid from public.close_leases l
    where l.trade_date = d and l.released_at is null and l.expires_at < pg_catalog.now()
    for update of l skip locked;
    if holder_pid is null then
        return false;  -- not expired, released, or locked by its publishing holder
    end if;
    if not exists (
            select 1 from pg_catalog.pg_stat_activity a
            join pg_catalog.pg_roles r on r.oid = a.usesysid
            where a.pid = holder_pid and a.application_name like 'settle-close %'
              and not r.rolsuper
              and pg_catalog.pg_has_role(a.usesysid, 'settle_settlement', 'member'))
       or not public.close_lock_held(d, holder_pid) then
        return false;
    end if;
    return pg_catalog.pg_terminate_backend(holder_pid);
end
$$;
alter function end_expired_close(date) owner to settle_close_reaper;
revoke all on function end_expired_close(date) from public;
grant execute on function end_expired_close(date) to settle_settlement;

do $$
begin
    execute format('revoke temporary on database %I from public', current_database());
end
$$;
