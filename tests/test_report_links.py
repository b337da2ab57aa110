"""The report file's Data Docs addresses are links relative to it (pure: no services)."""

from __future__ import annotations

from pathlib import Path

from settlement.report.html import relative_docs, safe_link


def test_data_docs_become_links_relative_to_the_report_file(tmp_path: Path) -> None:
    page = tmp_path / "gx" / "data docs" / "validations" / "day.html"
    reports = tmp_path / "reports" / "2026-11-27"
    facts = {"validation": {"data_docs": (tmp_path / "gx" / "index.html").as_uri(),
                            "data_docs_pages": {"day@as_read": page.as_uri()}},
             "other": 1}
    out = relative_docs(facts, reports)
    rel = out["validation"]["data_docs_pages"]["day@as_read"]
    assert rel == "../../gx/data%20docs/validations/day.html"
    assert safe_link(rel) == rel  # followable: a relative link, not file://
    assert out["validation"]["data_docs"] == "../../gx/index.html"
    assert facts["validation"]["data_docs"].startswith("file://")  # the stored facts kept
    assert out["other"] == 1
    # An http(s) address stays as it is; facts without validation pass through.
    web = {"validation": {"data_docs": "https://docs.example/index.html"}}
    assert relative_docs(web, reports) == web
    assert relative_docs({"x": 1}, reports) == {"x": 1}

