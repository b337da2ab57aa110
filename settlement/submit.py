"""spark-submit entry point of the end of day: ``spark-submit settlement/submit.py
--date D --source kafka|db [--reason R] [--only-if-unsettled yes|no]`` (what Airflow's
SparkSubmitOperator runs).

Nothing imports this module: it is the top of the stack, a thin shell around
``settlement.close.pipeline.run_eod`` that prints the run's summary as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# spark-submit puts --py-files first on the driver's sys.path as well. That zip
# (settlement/spark/package.py: settlement-<hash>.zip) is for the executors and holds code
# only; the driver must import the installed package, which carries the SQL and Great
# Expectations files next to it. Once imported from here, later imports of its modules
# follow the package's own path, whatever SparkContext adds to sys.path.
sys.path[:] = [p for p in sys.path
               if not (p.endswith(".zip") and Path(p).name.startswith("settlement-"))]

from settlement.close.pipeline import run_eod  # noqa: E402 - after the path fix
from settlement.config import check_date, load_settings  # noqa: E402 - after the path fix
from settlement.spark.jvm import allow_building  # noqa: E402 - after the path fix


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="settlement-job",
                                 description="Settle, validate and report one trade date.")
    ap.add_argument("--date", required=True, type=check_date)
    ap.add_argument("--source", choices=["auto", "kafka", "db"], default="auto")
    ap.add_argument("--no-validate", action="store_true")
    ap.add_argument("--reason", default=None,
                    help="why the caller chose --source (recorded instead of 'requested')")
    ap.add_argument("--accept-incomplete", metavar="REASON", default=None,
                    help="publish even if validation fails, recording this reason")
    ap.add_argument("--only-if-unsettled", choices=["yes", "no"], default="no",
                    help="yes: a date already published by a passing run since its close "
                         "markers is not settled again (the DAG's runs unless rerun=true)")
    args = ap.parse_args(argv)
    # The driver JVM is spark-submit's own, already started: the Airflow operator chose its
    # archive options (orchestration.operators.driver_archive). Allowed for a session this
    # process would start itself all the same: it is one close.
    allow_building()
    # A close of the date in progress elsewhere is joined: its outcome is printed instead.
    out = run_eod(load_settings(), args.date, source=args.source, validate=not args.no_validate,
                  reason=args.reason, accept_incomplete=args.accept_incomplete or None,
                  progress=lambda line: print(line, file=sys.stderr, flush=True),
                  only_if_unsettled=args.only_if_unsettled == "yes")
    print(json.dumps(out, default=str), flush=True)
    # A day that failed validation is a finished run (recorded, reported, not published): the
    # DAG's publish_report task reads the record and fails the run with the reasons.
    return 0


if __name__ == "__main__":
    from settlement.procexit import exit_now

    # spark-submit's JVM ends when this process does: without the interpreter's teardown
    # (settlement.procexit), 1 s sooner.
    exit_now(main())
