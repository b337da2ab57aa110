"""What the command groups share: the handler's signature, the failure that still prints its
JSON, the argument types, the help formatter, progress and preflight, and human output.

Each group module imports from here, never from another group or from the package's
``__init__`` (which imports every group): that keeps the groups independent and the imports
acyclic.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from settlement.config import ConfigError, Settings, check_date
from settlement.db import open_connection
from settlement.errors import START_SERVICES, ServiceError, redact

Handler = Callable[[argparse.Namespace, Settings], dict[str, Any]]
# What `settle` hands each group's `register`: the COMMAND subparsers.
Subparsers = argparse._SubParsersAction


class CommandFailed(RuntimeError):
    """The command ran but its outcome is a failure (e.g. validation); exit 1 with JSON."""

    def __init__(self, message: str, result: dict[str, Any]):
        super().__init__(message)
        self.result = result


def console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after an option's help, except where there is nothing to show
    (a flag, an unset default) or the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        # identity, not equality: 0 and 0.0 are defaults worth showing, False is a flag's
        if action.default is None or action.default is False or action.default == [] \
                or "default" in text:
            return action.help
        return super()._get_help_string(action)


JSON_HELP = "print one JSON object as the last line of stdout"


def add_command(sub: Subparsers, name: str, help: str, handler: Handler, *,
                prints_own: bool = False) -> argparse.ArgumentParser:
    """A command's parser, with the `--json` every command takes after its name, and the
    handler `settle` runs for it. prints_own: the handler shows its outcome to a person
    itself, so the generic dump of the result is skipped."""
    sp = sub.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)
    sp.add_argument("--json", action="store_true", help=JSON_HELP)
    sp.set_defaults(handler=handler, prints_own=prints_own)
    return sp


# -- argument types: a bad value exits 2 with argparse's usage and the reason -----------------
def date(value: str) -> str:
    try:
        return check_date(value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--date: ")) from None


def fraction(value: str) -> float:
    try:
        r = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction between 0 and 1, got {value!r}") from None
    if not 0 <= r <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {value}")
    return r


def int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
        return n

    return parse


def seconds(value: str) -> float:
    """A finite, positive number of seconds: 0, negatives, nan and inf are refused (there
    is no "0 means no limit": leave the option out for that)."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds > 0, got {value} (leave the option out for "
            "no limit)")
    return x


positive = int_at_least(1, "a positive integer")
non_negative = int_at_least(0, "an integer >= 0")


# -- what handlers share -------------------------------------------------------------------
def progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Progress lines of long work, on stderr (stdout keeps the JSON); quiet with --quiet."""
    out = console()

    def say(step: str) -> None:
        if not getattr(args, "quiet", False):
            out.print(f"[dim]settle {args.command}:[/] {step}", highlight=False)

    return say


def require_services(s: Settings, kafka: bool = True, postgres: bool = True,
                     timeout: float = 5.0) -> None:
    """Fail fast, saying how to start them, when the services a command needs are down
    (rather than a client library's raw error minutes later)."""
    if postgres:
        import psycopg

        try:
            open_connection(s.settlement_dsn, timeout=int(timeout)).close()
        except psycopg.OperationalError as e:
            raise ServiceError(f"PostgreSQL is not reachable at {redact(s.settlement_dsn)} "
                               f"({str(e).strip().splitlines()[0][:200]}): "
                               f"{START_SERVICES}") from None
    if kafka:
        from confluent_kafka import KafkaException

        from settlement.kafka.admin import admin_client

        try:
            admin_client(s).list_topics(timeout=timeout)
        except KafkaException:
            raise ServiceError(f"Kafka is not reachable at {s.bootstrap()}: "
                               f"{START_SERVICES}") from None


def print_human(result: dict[str, Any]) -> None:
    from rich.pretty import Pretty

    console().print(Pretty(result))
