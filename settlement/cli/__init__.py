"""The ``settle`` command line.

Every command accepts ``--json`` (before or after the command): the last line on stdout is
then one JSON object. Human output and progress go to stderr through rich so that stdout stays
machine-readable. Exit codes: 0 success (``status``: healthy), 1 failure (the message says
why; ``status``: unhealthy), 2 bad arguments or configuration. Errors never carry passwords.

One module per command group declares its commands' arguments (``register``, through
``common.add_command``, which also names the handler) and their handlers. This module only
assembles the groups and runs the chosen handler. A new group: a module with a
``register(sub)`` and one entry in ``GROUPS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from types import ModuleType

from settlement.cli import (
    airflow,
    archive,
    db,
    demo,
    drill,
    eod,
    instructions,
    kafka,
    refdata,
    services,
    simulate,
    site,
    stack,
    status,
)
from settlement.cli.common import JSON_HELP, CommandFailed, HelpFormatter, print_human
from settlement.config import ConfigError, load_settings
from settlement.errors import redact

# In the order `settle --help` lists their commands.
GROUPS: tuple[ModuleType, ...] = (
    status, services, stack, db, kafka, airflow, simulate, site, eod, instructions, refdata,
    archive, drill, demo,
)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("dual-site-settlement")
    except PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="settle", formatter_class=HelpFormatter,
        description="Dual-site failover settlement: Kafka -> PostgreSQL -> PySpark netting.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # --json before the command; every subcommand also takes it after (both work). A separate
    # dest: a subparser's own default would otherwise overwrite the value parsed here.
    p.add_argument("--json", dest="json_first", action="store_true", help=JSON_HELP)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.json = want_json = bool(getattr(args, "json", False) or args.json_first)
    try:
        settings = load_settings()
        result = args.handler(args, settings)
        code = 0
    except ConfigError as e:
        result, code = {"ok": False, "error": str(e)}, 2
    except CommandFailed as e:
        result, code = {"ok": False, "error": str(e), **e.result}, 1
    except KeyboardInterrupt:
        result, code = {"ok": False, "error": "interrupted"}, 130
    except Exception as e:  # noqa: BLE001 - the CLI's last line of defence: say what failed
        from settlement.errors import describe

        result, code = {"ok": False, "error": describe(e)}, 1
    else:
        result = {"ok": True, **result}
    if result.get("error") is not None:
        result["error"] = redact(str(result["error"]))
    if code != 0:
        print(f"settle {args.command}: error: {result['error']}", file=sys.stderr)
    if want_json:
        print(json.dumps(result, default=str), flush=True)
    elif code == 0 and not args.prints_own:
        print_human(result)
    if argv is None and getattr(args, "exit_now", False):
        # This process is the command (the entry point passes no argv): a close ends here,
        # without the interpreter's teardown (settlement.procexit).
        from settlement.procexit import exit_now

        exit_now(code)
    return code
