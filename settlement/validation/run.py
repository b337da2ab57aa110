"""Running the suites with Great Expectations 1.x and turning results into a verdict.

The GX project is a file context kept in the repository (``gx/``): suites, validation
definitions and checkpoints are JSON files there; results and Data Docs go to
``gx/uncommitted/`` (ignored by git). An installed wheel carries a copy and opens it under
the state directory (or ``SETTLE_GX_DIR``). ``ensure_project`` creates whatever is missing
and replaces a suite whose expectations differ from the code in ``suites.py``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from settlement.config import ConfigError, Settings, load_settings, resource_dir
from settlement.validation.suites import SuitePlan, all_suites

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

# A suite's frame, or what makes it when the suite's turn comes (a close's positions, netted
# while the suites before run).
Frame = DataFrame | Callable[[], DataFrame]

DATASOURCE = "settlement_spark"
BATCH = "whole_day"
# The Data Docs index lists this many of the newest validation results (GX's
# ``validation_results_limit``; gx/great_expectations.yml may set its own). Unbounded, every
# build read and parsed every result ever stored: with 600 stored, the index took 1.15 s of
# a close's 1.9 s docs build, and each close stores about nine more. Older runs keep their
# pages, which the run's ``data_docs_pages`` (and its audit report) link directly.
DOCS_INDEX_RESULTS = 100
EXAMPLES = 10


@dataclass
class CheckResult:
    suite: str
    asset: str
    name: str
    check: str
    success: bool
    observed: Any
    examples: list[Any] = field(default_factory=list)
    severity: str = "critical"  # a failed "warning" is reported and does not fail the run

    def as_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "asset": self.asset, "name": self.name,
                "check": self.check, "success": self.success, "observed": self.observed,
                "examples": self.examples, "severity": self.severity}


@dataclass
class ValidationOutcome:
    checks: list[CheckResult]
    skipped: dict[str, str]  # suite@asset -> why it did not apply
    data_docs: str | None
    seconds: dict[str, float] = field(default_factory=dict)  # suite@asset -> its run's time
    # suite@asset -> this run's own Data Docs page (listed by the index only while it is
    # among the newest ``DOCS_INDEX_RESULTS``; the page itself stays).
    data_docs_pages: dict[str, str] = field(default_factory=dict)
    # What the checksums found before any check ran: buckets compared, which differed and
    # were searched trade by trade (``settlement.spark.figures``).
    figures: dict[str, Any] = field(default_factory=dict)
    # Data Docs being built in a thread (``run_suites(docs_in_background=True)``).
    docs_pending: Future[bool] | None = field(default=None, repr=False, compare=False)

    def wait_for_docs(self) -> None:
        """Wait for Data Docs built in the background (no link when they failed)."""
        if self.docs_pending is not None:
            if not self.docs_pending.result():
                self.data_docs = None
                self.data_docs_pages = {}
            self.docs_pending = None

    @property
    def success(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        """Failed critical checks: these fail the run."""
        return [c for c in self.checks if not c.success and c.severity == "critical"]

    @property
    def warnings(self) -> list[CheckResult]:
        """Failed checks of a lower severity: reported, the run still passes."""
        return [c for c in self.checks if not c.success and c.severity != "critical"]

    def as_dict(self) -> dict[str, Any]:
        return {"success": self.success, "checks": len(self.checks),
                "failures": [c.as_dict() for c in self.failures],
                "warnings": [c.as_dict() for c in self.warnings],
                "passed": [f"{c.suite}@{c.asset}: {c.name}" for c in self.checks if c.success],
                "skipped": self.skipped, "data_docs": self.data_docs,
                "data_docs_pages": self.data_docs_pages,
                "seconds": self.seconds, "figures": self.figures}


def get_context(settings: Settings | None = None) -> Any:
    """The GX file context at ``Settings.gx_project_dir``: the checkout's gx/ (as before),
    else SETTLE_GX_DIR or, for an installed wheel, <state_dir>/gx. A project folder without
    great_expectations.yml is first seeded from the shipped gx/ (checkout or wheel), so an
    installed package never writes results or data sources into site-packages."""
    import shutil
    import tempfile

    import great_expectations as gx

    root = (settings or load_settings()).gx_project_dir
    if not (root / "great_expectations.yml").is_file():
        source = resource_dir("gx")
        ignore = shutil.ignore_patterns("uncommitted", "__pycache__")
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            if root.exists():
                shutil.copytree(source, root, ignore=ignore, dirs_exist_ok=True)
            else:  # copy aside, then rename: a concurrent first run sees all or nothing
                tmp = Path(tempfile.mkdtemp(prefix=".gx-", dir=root.parent))
                shutil.copytree(source, tmp / "gx", ignore=ignore)
                try:
                    (tmp / "gx").rename(root)
                except OSError:
                    if not (root / "great_expectations.yml").is_file():
                        raise
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        except OSError as e:
            raise ConfigError(
                f"cannot create the Great Expectations project at {root} from {source}: {e}; "
                "set SETTLE_GX_DIR (or SETTLE_STATE_DIR) to a writable folder"
            ) from None
    context = gx.get_context(mode="file", context_root_dir=str(root))
    limit_docs_index(context)
    return context


def limit_docs_index(context: Any, limit: int = DOCS_INDEX_RESULTS) -> None:
    """Each Data Docs site's index lists at most ``limit`` results unless the project's
    great_expectations.yml sets a limit of its own (a project seeded before the shipped one
    had it). In memory only: GX reads the site's settings when it builds (the raw settings:
    ``variables.data_docs_sites`` is a substituted copy)."""
    for site in (context.variables.config["data_docs_sites"] or {}).values():
        index = site.setdefault("site_index_builder", {"class_name": "DefaultSiteIndexBuilder"})
        index.setdefault("validation_results_limit", limit)


def _same_suite(a: Any, b: Any) -> bool:
    """Same expectations (type, query or arguments, names, descriptions), ids aside."""
    def key(s: Any) -> list[str]:
        out = []
        for e in s.expectations:
            conf = e.configuration.to_json_dict()
            # json: a str enum (severity) and its stored string compare equal
            out.append(json.dumps({k: conf.get(k) for k in
                                   ("type", "kwargs", "meta", "description", "severity")},
                                  sort_keys=True, default=str))
        return sorted(out)

    return key(a) == key(b)


def _prune(context: Any, ds: Any, plans: list[SuitePlan]) -> None:
    """Remove what the code no longer defines (a renamed suite or asset, a validation
    definition that moved), so that the project in gx/ is exactly ``all_suites()``. Names
    come from the stores' keys: a stale object may no longer load."""
    import great_expectations as gx

    def stored(store: Any) -> set[str]:
        return {k.to_tuple()[-1] for k in store.list_keys()}

    names = {p.name for p in plans}
    suites = {p.suite.name for p in plans}
    for factory, store, keep in (
            (context.checkpoints, context.checkpoint_store, names),
            (context.validation_definitions, context.validation_definition_store, names),
            (context.suites, context.expectations_store, suites)):
        for name in sorted(stored(store) - keep):
            try:
                factory.delete(name)
            except gx.exceptions.DataContextError:
                pass  # removed meanwhile by another run
    for name in sorted(ds.get_asset_names() - {p.asset for p in plans}):
        ds.delete_asset(name)


def ensure_project(context: Any) -> dict[str, Any]:
    """Data source, assets, suites, validation definitions and checkpoints, by name."""
    import great_expectations as gx

    try:
        ds = context.data_sources.get(DATASOURCE)
        ds.persist = False  # a project copied before the setting was shipped
    except (KeyError, ValueError):
        # persist=False: the run caches what it reads (GX would cache every frame it is
        # handed again, a second copy of a 10M-trade day).
        ds = context.data_sources.add_spark(name=DATASOURCE, persist=False)
    plans = all_suites()
    _prune(context, ds, plans)
    for name in dict.fromkeys(p.asset for p in plans):
        try:
            asset = ds.get_asset(name)
        except LookupError:
            asset = ds.add_dataframe_asset(name=name)
        try:
            asset.get_batch_definition(BATCH)
        except (KeyError, LookupError, ValueError):
            asset.add_batch_definition_whole_dataframe(BATCH)
    suites: dict[str, Any] = {}
    replaced: set[str] = set()
    for plan in plans:
        if plan.suite.name in suites:
            continue
        try:
            stored = context.suites.get(plan.suite.name)
        except gx.exceptions.DataContextError:
            stored = None
        if stored is None or not _same_suite(stored, plan.suite):
            if stored is not None:  # the code changed the suite: replace it, and what uses it
                context.suites.delete(plan.suite.name)
                replaced.add(plan.suite.name)
            stored = context.suites.add(plan.suite)
        suites[plan.suite.name] = stored
    checkpoints: dict[str, Any] = {}
    for plan in plans:
        name = plan.name
        if plan.suite.name in replaced:
            for store in (context.checkpoints, context.validation_definitions):
                try:
                    store.delete(name)
                except gx.exceptions.DataContextError:
                    pass
        try:
            vd = context.validation_definitions.get(name)
        except gx.exceptions.DataContextError:
            batch = ds.get_asset(plan.asset).get_batch_definition(BATCH)
            vd = context.validation_definitions.add(
                gx.ValidationDefinition(name=name, data=batch, suite=suites[plan.suite.name]))
        try:
            cp = context.checkpoints.get(name)
        except gx.exceptions.DataContextError:
            cp = None
        if cp is not None and cp.actions:
            # A project from before Data Docs were built once per run (see run_suites).
            try:
                context.checkpoints.delete(name)
            except gx.exceptions.DataContextError:
                pass  # removed meanwhile by another run
            cp = None
        if cp is None:
            try:
                cp = context.checkpoints.add(gx.Checkpoint(
                    name=name, validation_definitions=[vd], actions=[],
                    result_format={"result_format": "COMPLETE"},
                ))
            except gx.exceptions.DataContextError:
                cp = context.checkpoints.get(name)  # added meanwhile by another run
        checkpoints[name] = cp
    return checkpoints


def _examples(result: dict[str, Any]) -> list[Any]:
    details = (result.get("details") or {}).get("unexpected_rows")
    if details is not None:
        rows = details if isinstance(details, list) else _frame_rows(details)
        return [_plain(r) for r in rows[:EXAMPLES]]
    return [_plain(v) for v in (result.get("partial_unexpected_list") or [])[:EXAMPLES]]


def _frame_rows(value: Any) -> list[Any]:
    if hasattr(value, "to_dict"):
        return value.to_dict(orient="records")  # pandas
    if hasattr(value, "collect"):
        return [r.asDict() for r in value.limit(EXAMPLES).collect()]  # Spark
    return list(value)


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if hasattr(v, "asDict"):
        return _plain(v.asDict())
    if isinstance(v, int | float | str | bool) or v is None:
        return v
    return str(v)


def _run_checkpoint(context: Any, checkpoints: dict[str, Any], name: str, df: DataFrame) -> Any:
    from great_expectations.exceptions.resource_freshness import (
        ResourceFreshnessAggregateError,
    )

    try:
        return checkpoints[name].run(batch_parameters={"dataframe": df})
    except ResourceFreshnessAggregateError:
        # Another run replaced a suite since ensure_project (two first runs of a new version
        # at once): take the stored project again, once.
        checkpoints.update(ensure_project(context))
        return checkpoints[name].run(batch_parameters={"dataframe": df})


# GX projects being made ready ahead of a run (``prepare_context``), by project folder.
_prepared: dict[Path, Future[tuple[Any, dict[str, Any]]]] = {}
_prepared_lock = threading.Lock()


def _context_and_checkpoints(settings: Settings | None = None) -> tuple[Any, dict[str, Any]]:
    context = get_context(settings)
    return context, ensure_project(context)


def prepare_context(settings: Settings) -> None:
    """Start making the GX project ready (the context read from its files, the suites,
    validation definitions and checkpoints checked) in a thread, for the next ``run_suites``
    of the same project folder to take: a close does this while its Spark session starts and
    its day is read, where it cost the validation step about a second."""
    root = settings.gx_project_dir
    with _prepared_lock:
        if root in _prepared:
            return
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gx-context")
        _prepared[root] = pool.submit(_context_and_checkpoints, settings)
        pool.shutdown(wait=False)


def discard_prepared(settings: Settings) -> None:
    """Forget a preparation no run took (a close that failed before validating): a context
    read long before a later run would be stale by then (its Data Docs build failed)."""
    with _prepared_lock:
        _prepared.pop(settings.gx_project_dir, None)


def _ready_context() -> tuple[Any, dict[str, Any]]:
    """The prepared project of this process's GX folder if one was started (taken: the next
    run prepares its own), else made now. A preparation that failed is made again here, so
    its error is the run's own."""
    root = load_settings().gx_project_dir
    with _prepared_lock:
        ahead = _prepared.pop(root, None)
    if ahead is not None:
        try:
            return ahead.result()
        except Exception:  # noqa: BLE001 - made again below, raising in the run's own thread
            pass
    return _context_and_checkpoints()


def run_suites(frames: dict[str, Frame | None], skip: dict[str, str] | None = None,
               only: set[str] | None = None, docs_in_background: bool = False
               ) -> ValidationOutcome:
    """Validate each asset's frame with its suites; an asset without a frame is skipped.

    ``skip`` maps a suite name, or one ``suite@asset``, to a reason it does not apply (e.g.
    no Kafka to reconcile); ``only`` restricts the run to some ``suite@asset`` names.
    ``docs_in_background``: Data Docs are built in a thread; ``wait_for_docs`` before the
    outcome's ``data_docs`` is read. A frame given as a function is made when its suite
    runs (the suites run in ``all_suites()``'s order).
    """
    context, checkpoints = _ready_context()
    built: list[Any] = []  # what this run adds to Data Docs
    pages: dict[str, str] = {}
    skipped: dict[str, str] = {}
    checks: list[CheckResult] = []
    seconds: dict[str, float] = {}
    for plan in all_suites():
        name = plan.name
        if only is not None and name not in only:
            continue
        df = frames.get(plan.asset)
        why = (skip or {}).get(name) or (skip or {}).get(plan.suite.name)
        if df is None or why:
            skipped[name] = why or f"no {plan.asset} data for this run"
            continue
        if not isinstance(df, DataFrame):
            df = df()
        t0 = time.perf_counter()
        res = _run_checkpoint(context, checkpoints, name, df)
        seconds[name] = round(time.perf_counter() - t0, 3)
        built.extend(res.run_results)
        built.extend(k.expectation_suite_identifier for k in res.run_results)
        for key in res.run_results:
            page = _docs_url(context, only_if_exists=False, resource=key)
            if page is not None:
                pages[name] = page
        for vres in res.run_results.values():
            for er in vres.results:
                meta = er.expectation_config.meta or {}
                severity = getattr(er.expectation_config, "severity", None) or "critical"
                result = er.result or {}
                checks.append(CheckResult(
                    suite=plan.suite.name, asset=plan.asset,
                    name=str(meta.get("name", er.expectation_config.type)),
                    check=str(meta.get("check", "")), success=bool(er.success),
                    observed=_plain(result.get("observed_value",
                                               result.get("unexpected_count"))),
                    examples=[] if er.success else _examples(result),
                    severity=str(getattr(severity, "value", severity)),
                ))
    if not docs_in_background:
        ok = _build_docs(context, built)
        return ValidationOutcome(checks, skipped, _docs_url(context) if ok else None, seconds,
                                 data_docs_pages=pages if ok else {})
    # The verdict does not wait for the pages: the close publishes, writes its instructions
    # and its report (which links the site: its URL whether or not the index exists yet, as
    # in a new GX project) meanwhile, then waits (``wait_for_docs``).
    outcome = ValidationOutcome(checks, skipped, _docs_url(context, only_if_exists=False),
                                seconds, data_docs_pages=pages)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="data-docs")
    outcome.docs_pending = pool.submit(_build_docs, context, built)
    pool.shutdown(wait=False)
    return outcome


def _docs_url(context: Any, only_if_exists: bool = True, resource: Any = None) -> str | None:
    """The site's index, or with ``resource`` (a validation result's key) its page."""
    try:
        urls = context.get_docs_sites_urls(resource_identifier=resource,
                                           only_if_exists=only_if_exists)
    except Exception:  # noqa: BLE001 - a missing docs site must not hide the verdict
        return None
    return urls[0]["site_url"] if urls else None


def _build_docs(context: Any, built: list[Any]) -> bool:
    """Data Docs once for the whole run (the results and suites of this run, and the index),
    not once per checkpoint: each build renders the index again, about a second apiece on a
    small day. False when they could not be built."""
    try:
        if built:
            context.build_data_docs(resource_identifiers=built, build_index=True)
    except Exception:  # noqa: BLE001 - a missing docs site must not hide the verdict
        return False
    return True


def register_views(spark: SparkSession, views: dict[str, DataFrame]) -> None:
    for name, df in views.items():
        df.createOrReplaceTempView(name)
