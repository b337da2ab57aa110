-- Operations on call (issue 16): per-day audit reports, heartbeat retention, `settle status`.
-- Runnable with psql as is.

-- A day's report counts heartbeats within the day's ingestion window for every site at once,
-- and retention deletes by age: both range over beat_at alone (the existing index leads with
-- the site).
create index site_heartbeats_time on site_heartbeats (beat_at);

-- The day's ingestion window is bounded by when close markers were ingested.
create index close_markers_ingested on close_markers (ingested_at);

-- Sites delete their own old heartbeats (SETTLE_HEARTBEAT_RETENTION_DAYS); nothing else of a
-- ledger is ever deleted by a site.
grant delete on site_heartbeats to settle_site;
