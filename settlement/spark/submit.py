"""spark-submit entry point of the end of day: ``spark-submit settlement/spark/submit.py
--date D --source kafka|db [--reason R]`` (what Airflow's SparkSubmitOperator runs).

Nothing imports this module: it is the top of the stack, a thin shell around
``settlement.eod.pipeline.run_eod`` that prints the run's summary as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

from settlement.config import check_date, load_settings
from settlement.eod.pipeline import run_eod


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
    args = ap.parse_args(argv)
    out = run_eod(load_settings(), args.date, source=args.source, validate=not args.no_validate,
                  reason=args.reason, accept_incomplete=args.accept_incomplete or None)
    print(json.dumps(out, default=str), flush=True)
    # A day that failed validation is a finished run (recorded, reported, not published): the
    # DAG's publish_report task reads the record and fails the run with the reasons.
    return 0


if __name__ == "__main__":
    sys.exit(main())
