"""HTML rendering of the audit report facts: one self-contained page, no scripts.

The facts may come from a database row that someone other than the settlement job wrote (the
report pages render stored JSON), so every field is escaped where it is placed, numbers are
formatted only when they are numbers, links keep only http(s) and relative targets, and the
page carries a Content-Security-Policy that forbids scripts outright.
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

# Inline CSS and SVG only: no script, no remote asset, no form, no frame.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'self'")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1100px;color:#1b1f24;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;
border-bottom:1px solid #d0d7de;padding-bottom:.3rem}
.verdict{display:inline-block;padding:.35rem .8rem;border-radius:6px;font-weight:700}
.pass{background:#dafbe1;color:#116329}.fail{background:#ffebe9;color:#a40e26}
.kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(11rem,1fr));gap:.8rem;
margin:1rem 0}
.kpi{border:1px solid #d0d7de;border-radius:6px;padding:.6rem .8rem}
.kpi b{display:block;font-size:1.3rem}.kpi span{color:#57606a;font-size:.85rem}
table{border-collapse:collapse;width:100%;margin:.5rem 0}
th,td{border-bottom:1px solid #eaeef2;padding:.3rem .5rem;text-align:left}
a,code,td,li{overflow-wrap:anywhere}svg{max-width:100%;height:auto}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#57606a}code{background:#f6f8fa;padding:0 .25rem;border-radius:3px}
"""
COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df")


def _e(v: Any) -> str:
    return escape("" if v is None else str(v))


def _n(v: Any) -> str:
    """An integer with thousands separators; anything else as text (escaped where placed)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "" if v is None else str(v)


def safe_link(url: Any) -> str | None:
    """``url`` when it is an http(s) or relative link, else None (javascript:, data:,
    file: and the like are shown as text, never followed)."""
    if not isinstance(url, str) or not url.strip():
        return None
    text = "".join(url.split())  # browsers ignore whitespace and controls inside a scheme
    scheme = urlsplit(text).scheme.lower()
    if scheme in ("http", "https") or (not scheme and not text.startswith("//")):
        return url
    return None


def relative_docs(facts: dict[str, Any], base: Path) -> dict[str, Any]:
    """The facts with their Data Docs addresses (``file://`` URLs, which a page may show but
    never follow) as paths relative to ``base``, the folder of the report file: followable
    links wherever the report is opened from disk. Other addresses are left as they are."""
    v = facts.get("validation")
    if not isinstance(v, dict):
        return facts

    def rel(url: Any) -> Any:
        if isinstance(url, str) and url.startswith("file://"):
            target = Path(unquote(urlsplit(url).path))
            return quote(os.path.relpath(target, base))
        return url

    pages = v.get("data_docs_pages")
    v = {**v, "data_docs": rel(v.get("data_docs")),
         **({"data_docs_pages": {k: rel(u) for k, u in pages.items()}}
            if isinstance(pages, dict) else {})}
    return {**facts, "validation": v}


def _link(url: str) -> str:
    """A followable link, or the address as text (``safe_link``)."""
    link = safe_link(url)
    return f'<a href="{_e(link)}">{_e(link)}</a>' if link else f"<code>{_e(url)}</code>"


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f'<th class="{"n" if i in numeric else ""}">{_e(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"n" if i in numeric else ""}">{_e(c)}</td>'
                         for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _amendments_section(a: Any) -> list[str]:
    """Busts and corrections: settled in their final states; each listed with the trade
    before and after it and its cash effect (the change in the trade's notional)."""
    if not isinstance(a, dict) or not (a.get("cancelled") or a.get("corrections")):
        return []
    listed = a.get("listed") if isinstance(a.get("listed"), list) else []
    total = int(a.get("cancelled") or 0) + int(a.get("corrections") or 0)
    return [
        "<h2>Busts and corrections</h2>",
        f'<p data-amendments="{_e(total)}">{_e(a.get("cancelled"))} trade(s) busted and '
        f'{_e(a.get("corrections"))} correction(s) applied: the day is settled in its final '
        f'states. Change in notional: <b>{_e(_money(a.get("notional_change")))}</b>'
        + (f" (the {len(listed)} largest by cash effect listed)" if len(listed) < total
           else "") + ".</p>",
        _table(["trade", "kind", "version", "partition", "seq", "price before", "qty before",
                "price after", "qty after", "notional change", "reason"],
               [[x.get("trade_id"), x.get("kind"), x.get("version") or "", x.get("kafka_partition"),
                 x.get("seq"), x.get("price_before") or "", x.get("quantity_before") or "",
                 x.get("price_after") or "", x.get("quantity_after") or "",
                 _money(x.get("notional_change")), x.get("reason") or ""]
                for x in listed if isinstance(x, dict)], {2, 3, 4, 5, 6, 7, 8, 9}),
    ]


def _settlement_section(st: Any) -> list[str]:
    """The published day's instructions: settlement date, files, the per-member summary,
    fails carried in and out."""
    if not isinstance(st, dict):
        return []
    files = st.get("files") if isinstance(st.get("files"), dict) else {}
    links = []
    for fmt, path in files.items():
        link = safe_link(path)
        links.append(f'<a data-instructions="{_e(fmt)}" href="{_e(link)}">{_e(fmt)}</a>'
                     if link else f"<code>{_e(path)}</code>")
    carried_in = st.get("carried_in") if isinstance(st.get("carried_in"), list) else []
    carried_out = st.get("carried_out") if isinstance(st.get("carried_out"), list) else []
    out = ["<h2>Settlement</h2>",
           f'<p>Settles on <b data-settlement-date="{_e(st.get("settlement_date"))}">'
           f'{_e(st.get("settlement_date"))}</b>: {_e(st.get("instructions"))} instruction(s), '
           f'version {_e(st.get("version"))}. Files: {", ".join(links) or "none"}.</p>',
           f'<p data-carried-in="{len(carried_in)}">Fails carried in from earlier settlement '
           f'dates: {_e(", ".join(str(x) for x in carried_in)) or "none"}.</p>']
    members = st.get("members") if isinstance(st.get("members"), list) else []
    if members:
        out.append(f'<h3 data-members="{len(members)}">Per member</h3>')
        out.append(_table(["member", "mapped", "accounts", "instructions", "securities in",
                           "securities out", "money in", "money out", "net money", "marks",
                           "money line", "fails carried in", "oldest fail due",
                           "its age (settlement days)"],
                          [[x.get("member"), x.get("mapped"), x.get("accounts"),
                            x.get("instructions"), x.get("securities_in"),
                            x.get("securities_out"), _money(x.get("money_in")),
                            _money(x.get("money_out")), _money(x.get("net_money")),
                            _money(x.get("marks")), _money(x.get("money_line")),
                            x.get("fails_carried_in"), x.get("oldest_fail_settlement_date"),
                            x.get("oldest_fail_age_days")]
                           for x in members if isinstance(x, dict)],
                          {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13}))
    if carried_out:
        out.append(f'<h3 data-carried-out="{len(carried_out)}">Fails carried out (reported by '
                   "the settlement agent)</h3>")
        out.append(_table(["instruction", "account", "symbol", "answer", "open quantity",
                           "open amount", "carried into run"],
                          [[x.get("instruction_id"), x.get("account"), x.get("symbol"),
                            x.get("status"), x.get("open_quantity"), x.get("open_amount"),
                            x.get("carried_into_run") or "open"]
                           for x in carried_out if isinstance(x, dict)], {4, 5}))
    return out


def _money(v: Any) -> str:
    try:
        return f"{float(v):,.2f}"  # display only; the JSON keeps the exact decimal string
    except (TypeError, ValueError, OverflowError):
        return "" if v is None else str(v)  # as text: escaped where placed


def _site_series(raw: Any) -> dict[str, list[int]]:
    """site -> its counts, keeping only numbers (the facts may come from a forged row)."""
    if not isinstance(raw, dict):
        return {}
    out = {str(site): [int(x) for x in values
                       if isinstance(x, int | float) and not isinstance(x, bool)]
           for site, values in raw.items() if isinstance(values, list)}
    return {site: values for site, values in out.items() if values}


def ingest_chart(series: dict[str, Any], width: int = 1000, height: int = 220) -> str:
    """Trades applied per site over the ingest span, one line per site (an inline SVG)."""
    sites = _site_series(series.get("sites") if isinstance(series, dict) else None)
    if not sites:
        return '<p class="muted">No ingest batches recorded.</p>'
    n = max(len(v) for v in sites.values())
    top = max(max(v) for v in sites.values()) or 1
    pad, w, h = 50, width - 70, height - 50

    def x(i: int) -> float:
        return pad + (w * i / max(n - 1, 1))

    def y(v: int) -> float:
        return 10 + h - h * v / top

    per = series.get("seconds_per_bucket")
    per = per if isinstance(per, (int, float)) and not isinstance(per, bool) else 0
    parts = [f'<svg role="img" aria-label="trades ingested per site over the day" '
             f'viewBox="0 0 {width} {height}" width="100%">',
             f'<line x1="{pad}" y1="{10 + h}" x2="{pad + w}" y2="{10 + h}" stroke="#8c959f"/>',
             f'<text x="4" y="18" font-size="11" fill="#57606a">{top:,}</text>',
             f'<text x="4" y="{10 + h}" font-size="11" fill="#57606a">0</text>',
             f'<text x="{pad}" y="{height - 8}" font-size="11" fill="#57606a">'
             f'{_e(str(series.get("start", ""))[11:19])} UTC</text>',
             f'<text x="{pad + w - 70}" y="{height - 8}" font-size="11" fill="#57606a">'
             f'{_e(str(series.get("end", ""))[11:19])} UTC</text>',
             f'<text x="{pad + w / 2 - 90}" y="{height - 8}" font-size="11" fill="#57606a">'
             f'trades applied per {per:g} s</text>']
    for k, (site, values) in enumerate(sorted(sites.items())):
        coords = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        color = COLORS[k % len(COLORS)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                     f'points="{coords}"/>')
        parts.append(f'<text x="{pad + 10 + 90 * k}" y="26" font-size="12" fill="{color}">'
                     f'site {_e(site)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(f: dict[str, Any]) -> str:
    v = f["validation"]
    ok = v["success"]
    verdict = ('<span class="verdict pass">VALIDATION PASSED</span>' if ok else
               f'<span class="verdict fail">VALIDATION FAILED: {len(v["failures"])} '
               "check(s)</span>")
    eff = f["netting_efficiency"]
    try:
        eff_text = "n/a" if eff is None else f"{float(eff) * 100:.2f}%"
    except (TypeError, ValueError):
        eff_text = str(eff)
    kpis = [("trades settled", _n(f["trades"])), ("source", f["source"]),
            ("netting efficiency", eff_text), ("gross notional", _money(f["gross_notional"])),
            ("net settlement", _money(f["net_settlement"])), ("accounts", f["accounts"]),
            ("duplicates removed", f["duplicates_removed_in_settlement"]),
            ("malformed in source", f["malformed_in_source"])]
    out = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">',
        f"<title>{_e(f['title'])}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(f['title'])}</h1>",
        f'<p class="muted">run {_e(f["run_id"])} &middot; generated {_e(f["generated_at"])}</p>',
        verdict,
        f'<p data-publication="{"published" if f["publication"]["published"] else "held"}">'
        f'<b>{"Published" if f["publication"]["published"] else "Not published"}</b>: '
        f'{_e(f["publication"]["note"])}</p>',
        *([f'<p class="amended" data-amended-since="{_e(f["amended_since"]["since"])}"><b>'
           f'Amended since {_e(f["amended_since"]["since"])}</b>: '
           f'{_e(f["amended_since"]["amendments"])} post-close amendment(s) of this day await '
           "a re-close (settle eod --date D --reclose, or the eod_reclose DAG); this "
           "published version stands until a re-close publishes the next.</p>"]
          if isinstance(f.get("amended_since"), dict) else []),
        '<div class="kpis">' + "".join(
            f'<div class="kpi"><b data-kpi="{_e(k)}">{_e(val)}</b><span>{_e(k)}</span></div>'
            for k, val in kpis) + "</div>",
        "<h2>Source</h2>",
        f"<p><b>{_e(f['source'])}</b>: {_e(f['source_reason'])}</p>",
        "<h2>Partitions</h2>",
        _table(["partition", "offsets [start, end)", "close marker last seq", "trades"],
               [[p, d.get("offsets", "-"), d.get("last_seq", "-"), d.get("trades", 0)]
                for p, d in f["partitions"].items()], {2, 3}),
        "<h2>Validation</h2>",
    ]
    if v.get("data_docs"):
        out.append(f"<p>Great Expectations Data Docs: {_link(v['data_docs'])}</p>")
    if v.get("data_docs_pages"):
        # The run's own pages: the index lists only the newest results.
        out.append('<ul class="docs-pages">' + "".join(
            f"<li>{_e(name)}: {_link(url)}</li>"
            for name, url in sorted(v["data_docs_pages"].items())) + "</ul>")
    if v["failures"]:
        out.append(_table(["suite", "check", "observed", "examples"],
                          [[c["suite"] + "@" + c["asset"], c["name"], c["observed"],
                            "; ".join(str(x) for x in c["examples"][:5])]
                           for c in v["failures"]]))
    if v.get("warnings"):
        out.append("<h3>Warnings (do not block publication)</h3>")
        out.append(_table(["suite", "check", "observed", "examples"],
                          [[c["suite"] + "@" + c["asset"], c["name"], c["observed"],
                            "; ".join(str(x) for x in c["examples"][:5])]
                           for c in v["warnings"]]))
    out.append(f'<p class="muted">{_e(v["checks"])} checks run, {len(v["passed"])} passed. '
               "Not applicable: " + (_e(", ".join(f"{k} ({r})"
                                                  for k, r in v["skipped"].items())) or "none")
               + "</p>")
    if f.get("late_trades_in_range"):
        out.append("<h3>Late trades of earlier days in this day's Kafka range (not settled "
                   "here; the sites dead-letter them as late)</h3>")
        out.append(_table(["trade date", "partition", "late trades"],
                          [[d, p, n] for d, parts in f["late_trades_in_range"].items()
                           for p, n in parts.items()], {2}))
    out.extend(_amendments_section(f.get("amendments")))
    out.extend(_settlement_section(f.get("settlement")))
    out.append("<h2>Largest obligations</h2>")
    out.append(_table(["account", "net cash", "direction", "bought", "sold", "trades"],
                      [[o["account"], _money(o["net_cash"]),
                        "pays the CCP" if o["pays"] else "receives from the CCP",
                        _money(o["buy_amount"]), _money(o["sell_amount"]), o["trades"]]
                       for o in f["largest_obligations"]], {1, 3, 4, 5}))
    for name, led in f["ledgers"].items():
        out.append(f"<h2>Ledger {_e(name)}</h2>")
        start, end = led.get("ingest_window") or (None, None)
        out.append('<p class="muted" data-window="ingest">Figures of this day only: dead '
                   "letters by the day's offsets, batches and heartbeats committed after "
                   f"{_e(start[:19].replace('T', ' ') + ' UTC') if start else 'the start'} "
                   f"and up to {_e(end[:19].replace('T', ' ') + ' UTC') if end else 'now'} "
                   "(the previous and this day's last close markers).</p>")
        out.append("<h3>Trades ingested per site over the day</h3>")
        out.append(ingest_chart(led["ingest_series"]))
        out.append(_table(["site", "trades ingested", "duplicates suppressed", "dead letters"],
                          [[s, d["trades_ingested"], d["duplicates_suppressed"],
                            d["dead_letters"]] for s, d in led["sites"].items()], {1, 2, 3}))
        if led["dead_letters_by_reason"]:
            out.append(_table(["dead-letter reason", "messages"],
                              [[r, n] for r, n in led["dead_letters_by_reason"].items()], {1}))
        if led.get("late_trades"):
            out.append("<h3>Late trades of this day (after its close marker; dead-lettered)</h3>")
            out.append(_table(["partition", "late trades"],
                              [[p, n] for p, n in led["late_trades"].items()], {1}))
        if led.get("data_loss_events"):
            out.append('<h3 data-loss="yes">Data loss: offsets deleted by retention before '
                       "the site read them</h3>")
            out.append(_table(["partition", "offsets [from, to)", "site", "detected (UTC)"],
                              [[e["partition"], f"[{e['from_offset']}, {e['to_offset']})",
                                e["site"], e["detected_at"][:19]]
                               for e in led["data_loss_events"]]))
        events = [e for e in led["failover_events"] if e["event"] != "last heartbeat"]
        out.append("<h3>Failover events seen in the heartbeats</h3>")
        out.append(_table(["time (UTC)", "site", "event", "detail"],
                          [[e["at"][11:19], e["site"], e["event"], e["detail"]]
                           for e in events]) if events else
                   '<p class="muted">None: no site went silent and no partition moved.</p>')
    out.append("<h2>Instruments</h2>")
    out.append(_table(["symbol", "trades", "volume", "notional", "VWAP"],
                      [[i["symbol"], i["trades"], i["volume"], _money(i["notional"]), i["vwap"]]
                       for i in f["instruments"]], {1, 2, 3, 4}))
    if f.get("timings"):
        # So a slow day can be explained: the steps of this run up to the report itself
        # (the report's own time and the total are in settlement_runs.timings).
        out.append("<h2>Step timings</h2>")
        out.append(_table(["step", "seconds"],
                          [[k.removesuffix("_seconds"), v] for k, v in f["timings"].items()],
                          {1}))
    out.append("</body></html>")
    return "\n".join(out)
