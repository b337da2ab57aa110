"""The reference pages are what the code generates (`make docs`), and say what it holds."""

from __future__ import annotations

import subprocess
import sys

from settlement.cli import build_parser
from settlement.cli.reference import PAGES_DIR, cli_page, configuration_page, stale_pages
from settlement.config import SETTING_GROUPS, Settings


def test_the_committed_reference_pages_are_what_make_docs_generates() -> None:
    assert stale_pages() == [], "run `make docs` and commit docs/reference/"


def test_every_setting_is_in_one_group_with_a_meaning_and_on_the_page() -> None:
    page = configuration_page()
    grouped = [name for g in SETTING_GROUPS for name in g.model_fields]
    assert sorted(grouped) == sorted(Settings.model_fields)  # each once, none left out
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description for the reference"
        assert page.count(f"`SETTLE_{name.upper()}`") == 1, name


def test_every_command_is_on_the_cli_page_with_its_options() -> None:
    page = cli_page()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        assert f"## `settle {name}`" in page, name
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in page, f"settle {name} {flag}"


def test_check_names_a_page_that_drifted(tmp_path) -> None:
    (tmp_path / "configuration.md").write_text(configuration_page().replace("15432", "15433"))
    (tmp_path / "cli.md").write_text(cli_page())
    assert stale_pages(tmp_path) == ["configuration.md"]
    assert (PAGES_DIR / "cli.md").is_file()
    done = subprocess.run([sys.executable, "-m", "settlement.cli.reference", "--check"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def _anchors(page: str) -> set[str]:
    """GitHub's anchors of a Markdown page: each heading's slug, and explicit ids."""
    import re

    out = set(re.findall(r'<a id="([^"]+)">', page))
    for heading in re.findall(r"^#+ (.+)$", page, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_link_between_the_readme_and_the_docs_leads_somewhere() -> None:
    import re

    from settlement.config import REPO_ROOT

    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check offline
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert broken == []
