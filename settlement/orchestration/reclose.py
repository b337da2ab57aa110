"""The eod_reclose DAG's steps: compute and validate a re-close, show its delta for an
operator's approval, publish it once approved, and record the decision either way.

The DAG file (dags/eod_reclose.py) only wires these. The re-close is the close's own code
(``settlement.close.pipeline.run_eod`` with ``reclose`` and ``hold``): the date's lease, the
same read, settlement and validation; what differs is that a validated result is held, not
published, until an operator approves it in the UI (Airflow's human-in-the-loop
``ApprovalOperator``). Rejected, nothing is published; the decision is in
``reclose_decisions`` (the audit trail) either way.
"""

from __future__ import annotations

from typing import Any

from settlement.config import Settings

APPROVE, REJECT = "Approve", "Reject"  # ApprovalOperator's options


class RecloseFailed(RuntimeError):
    """The re-close did not produce a validated result to approve."""


def compute(settings: Settings, trade_date: str, source: str,
            triggered_by: str | None = None) -> dict[str, Any]:
    """Settle and validate ``trade_date`` again with its post-close amendments and hold the
    result, recording who asked for it (``triggered_by``: its approver must be another).
    Returns what the approval shows (no secrets: XCom is visible in the UI):
    ``nothing_to_reclose`` when no amendment awaits, else the held run and its delta."""
    from settlement.close.pipeline import run_eod

    out = run_eod(settings, trade_date, source=source, reclose=True, hold=True,
                  progress=print, triggered_by=triggered_by)
    if out.get("nothing_to_reclose"):
        return {"trade_date": trade_date, "nothing_to_reclose": True,
                "note": out["publication"]}
    if "joined_run_id" in out:
        raise RecloseFailed(f"another close of {trade_date} was in progress and this re-close "
                            f"joined it (run {out['joined_run_id']}: {out['publication']}); "
                            "trigger the re-close again if amendments still await")
    if not out.get("held_for_approval"):
        raise RecloseFailed(f"run {out.get('run_id')} of {trade_date} was not held for "
                            f"approval: {out.get('publication')} (report: "
                            f"{out.get('report_path')})")
    return {"trade_date": trade_date, "nothing_to_reclose": False, "run_id": out["run_id"],
            "source": out["source"], "trades": out.get("trades"),
            "amendments": out["reclosed"]["amendments"],
            "amended_since": out["reclosed"]["since"],
            "published_version": out["reclosed"]["version"],
            "delta": out["delta"], "report_path": out.get("report_path"),
            "triggered_by": triggered_by}


def approval_body(held: dict[str, Any]) -> str:
    """The approval's text (Markdown): what changes if it is approved."""
    if held.get("nothing_to_reclose"):
        return f"Nothing to re-close: {held['note']}. Reject (nothing will be published)."
    d = held["delta"]
    return (f"Re-close of **{held['trade_date']}** (run {held['run_id']}, from "
            f"{held['source']}): {held['amendments']} post-close amendment(s) since "
            f"{held['amended_since']}, validated.\n\n"
            f"Approving publishes it as version {(held['published_version'] or 0) + 1} "
            f"(version {held['published_version']} stays readable in positions_by_version) "
            "and writes its settlement instructions.\n\n"
            f"**Delta against the published day:** {d['positions']} position(s) of "
            f"{d['accounts']} account(s) change; quantity moved {d['quantity_moved']}, cash "
            f"moved {d['cash_moved']}.\n\nAudit report: {held.get('report_path')}")


def chosen(decision: Any) -> tuple[str, str]:
    """(approved|rejected, who) from ApprovalOperator's result (its XCom); no result (the
    approval timed out or failed) is a rejection by nobody."""
    if not isinstance(decision, dict) or not decision.get("chosen_options"):
        return "rejected", "nobody (no answer)"
    user = decision.get("responded_by_user") or {}
    who = str(user.get("name") or user.get("id") or "unknown") if isinstance(user, dict) \
        else str(user)
    return ("approved" if decision["chosen_options"][0] == APPROVE else "rejected"), who


def publish(settings: Settings, held: dict[str, Any], decision: Any = None) -> dict[str, Any]:
    """The approved run, published as the day's next version (under the date's lease), if
    its approver is not the operator who triggered it."""
    from settlement.close.pipeline import publish_held

    if held.get("nothing_to_reclose"):
        return {"published": False, "note": held["note"]}
    _verdict, who = chosen(decision)
    return publish_held(settings, int(held["run_id"]), held["trade_date"], progress=print,
                        approved_by=None if decision is None else who)


def record(settings: Settings, held: dict[str, Any], decision: Any,
           published: dict[str, Any] | None) -> dict[str, Any]:
    """The operator's decision and what came of it, in the audit trail."""
    from settlement.close.pipeline import record_decision

    if held.get("nothing_to_reclose"):
        return {"recorded": False, "note": held["note"]}
    verdict, who = chosen(decision)
    if verdict == "approved" and published and published.get("published"):
        outcome = f"published as version {published['version']}"
    elif verdict == "approved":
        outcome = "approved, but the publication failed: see the publish task's log"
    else:
        outcome = "rejected: nothing published; the published day stands"
    decision_id = record_decision(settings, int(held["run_id"]), held["trade_date"], verdict,
                                  who, held["delta"], outcome)
    print(f"decision {decision_id}: run {held['run_id']} {verdict} by {who}: {outcome}")
    return {"decision_id": decision_id, "decision": verdict, "decided_by": who,
            "outcome": outcome}
