-- Named statements of the audit report (settlement/report/).

-- name: store_report
insert into audit_reports (trade_date, run_id, report_json, html_path)
values (%(trade_date)s, %(run_id)s, %(report_json)s, %(html_path)s)
on conflict (trade_date, run_id) do update
set report_json = excluded.report_json, html_path = excluded.html_path, created_at = now()

-- name: dead_letters_by_reason
select reason, count(*) from dead_letters where topic = %(topic)s group by 1

-- name: ingest_batches
-- One row per committed batch (a day of 10M trades is ~500 rows), bucketed for the chart.
select site, committed_at, inserted from ingest_batches order by committed_at

-- name: duplicates_by_site
select site, sum(duplicates), sum(inserted), sum(dead_letters) from ingest_batches group by 1

-- name: heartbeats
select site, beat_at, partitions from site_heartbeats order by site, beat_at
