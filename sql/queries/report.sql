-- Named statements of the audit report (settlement/report/).

-- name: store_report
insert into audit_reports (trade_date, run_id, report_json, html_path)
values (%(trade_date)s, %(run_id)s, %(report_json)s, %(html_path)s)
on conflict (trade_date, run_id) do update
set report_json = excluded.report_json, html_path = excluded.html_path, created_at = now()

-- name: dead_letters_by_reason
-- The reason up to its first ':' groups "invalid JSON: ..." messages together.
select split_part(reason, ':', 1) as reason, count(*) from dead_letters
where topic = %(topic)s
group by 1 order by 2 desc

-- name: ingest_by_site
-- Trades newly applied per site per minute, for the chart.
select site, date_trunc('minute', committed_at) as minute, sum(inserted), sum(duplicates)
from ingest_batches
group by 1, 2 order by 2, 1

-- name: duplicates_by_site
select site, sum(duplicates), sum(inserted), sum(dead_letters) from ingest_batches group by 1

-- name: heartbeats
select site, beat_at, partitions from site_heartbeats order by site, beat_at
