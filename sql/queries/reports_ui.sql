-- Named statements of the audit-report pages in the Airflow UI
-- (settlement/orchestration/reports_app.py). Read-only: the auditor role can run them.

-- name: report_index
-- Every stored report with its run's verdict, newest trade date first.
select a.trade_date, a.run_id, r.source, r.source_reason, r.status, r.validation_success,
       r.published_at is not null, r.accepted_incomplete, r.error, r.trades, a.created_at
from audit_reports a
join settlement_runs r on r.run_id = a.run_id
order by a.trade_date desc, a.run_id desc
limit %(limit)s

-- name: report_of_run
-- Only the stored facts: the page never reads a file a row names.
select report_json from audit_reports where run_id = %(run_id)s
