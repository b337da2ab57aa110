-- Named statements of the close lease (settlement/eod/lease.py; table in migration 0008).

-- name: try_lock
-- The date's close lock, held by this session until it ends or unlocks (key: migration 0010).
select pg_try_advisory_lock(close_lease_key(%(trade_date)s::date))

-- name: unlock
select pg_advisory_unlock(close_lease_key(%(trade_date)s::date))

-- name: lease
-- The row as a waiter sees it, with the outcome of the run it names and whether it was last
-- renewed on another incarnation of the server than this one (a restart, or another member
-- promoted: its holder's session died with the server, not with the holder, so it may come
-- back and take its lease again until the lease expires). Rows renewed before migration 0016
-- recorded no incarnation: their renewal time against this server's start.
select l.token, l.run_id, l.holder, l.backend_pid, l.acquired_at, l.released_at,
       l.expires_at < now(), extract(epoch from now() - l.acquired_at),
       r.status, r.validation_success,
       coalesce(l.renewed_on <> pg_postmaster_start_time(),
                l.renewed_at < pg_postmaster_start_time())
from close_leases l left join settlement_runs r on r.run_id = l.run_id
where l.trade_date = %(trade_date)s

-- name: take
-- Called with the lock held: this session is the date's only close, whatever the row said.
insert into close_leases as l (trade_date, token, holder, backend_pid, expires_at, renewed_on)
values (%(trade_date)s, nextval('close_lease_tokens'), %(holder)s, pg_backend_pid(),
        now() + make_interval(secs => %(ttl)s), pg_postmaster_start_time())
on conflict (trade_date) do update
set token = excluded.token, run_id = null, holder = excluded.holder,
    backend_pid = excluded.backend_pid, acquired_at = now(), renewed_at = now(),
    expires_at = excluded.expires_at, released_at = null, renewed_on = excluded.renewed_on
returning token

-- name: abandon_running
-- Runs of the date still 'running' when a close takes the lease: nobody holds them any more.
update settlement_runs
set status = 'abandoned', finished_at = now(), error = %(reason)s
where trade_date = %(trade_date)s and status = 'running'
returning run_id, holder

-- name: attach_run
update close_leases set run_id = %(run_id)s
where trade_date = %(trade_date)s and token = %(token)s

-- name: renew
update close_leases
set renewed_at = now(), expires_at = now() + make_interval(secs => %(ttl)s),
    renewed_on = pg_postmaster_start_time()
where trade_date = %(trade_date)s and token = %(token)s and released_at is null

-- name: retake
-- A holder whose lease session ended (a server restart, a cut connection) and that holds the
-- date's lock again on a new session: the lease is still its own only if the row still
-- carries its token, unreleased.
update close_leases
set backend_pid = pg_backend_pid(), renewed_at = now(),
    expires_at = now() + make_interval(secs => %(ttl)s), renewed_on = pg_postmaster_start_time()
where trade_date = %(trade_date)s and token = %(token)s and released_at is null

-- name: release
update close_leases set released_at = now()
where trade_date = %(trade_date)s and token = %(token)s and released_at is null

-- name: end_expired
select end_expired_close(%(trade_date)s)

-- name: fence
-- Inside the publishing transaction: the row stays locked until commit, so a close taking
-- the lease meanwhile waits for this publication and never interleaves with it. A token is
-- only good while its lease session holds the date's lock: once a waiter has ended an expired
-- holder's session, that holder cannot publish even before the waiter replaces the token (a
-- live pid alone proves nothing: a new session may carry the number after a restart).
select l.token, close_lock_held(l.trade_date, l.backend_pid)
from close_leases l
where l.trade_date = %(trade_date)s
for update of l

-- name: settled_by
-- The date's published run if it passed validation (not forced through), with the close
-- markers it was chosen against (settlement_runs.offsets, written by start_run).
select r.run_id, r.offsets -> 'marker_offsets'
from published_days p join settlement_runs r on r.run_id = p.run_id
where p.trade_date = %(trade_date)s and r.validation_success
  and r.accepted_incomplete is null

-- name: closes_in_progress
select l.trade_date, l.run_id, l.holder, l.acquired_at, l.expires_at < now(), l.token
from close_leases l where l.released_at is null
order by l.trade_date desc

-- name: abandoned_runs
select run_id, trade_date, holder, finished_at, error
from settlement_runs
where status = 'abandoned' and finished_at > now() - make_interval(days => %(days)s)
order by run_id desc
limit 20
