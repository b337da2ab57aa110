-- Exactly one publication (issue 56). Runnable with psql as is.
--
-- 1. The lease's grace for a holder whose session ended with its server (not with the
--    holder) compared renewed_at with this server's start time: a promoted standby started
--    long before the renewal, so after a failover a live holder got no grace at all. A
--    renewal now records the incarnation of the server it renewed on (its postmaster's start
--    time: a restart or another member of the cluster has another); a row renewed on another
--    incarnation than the one a waiter asks is one whose session the server lost.
-- 2. A re-close held for approval names the published run it was computed against, and who
--    asked for it: its publication requires that run to be still the published one (checked
--    in the fenced publishing transaction), and its approver must be someone else.

alter table close_leases add column renewed_on timestamptz;

alter table settlement_runs
    add column based_on_run bigint references settlement_runs (run_id),
    add column triggered_by text;
