"""Great Expectations imported without SciPy's statistics and Altair
(settlement.validation.gximport), and both still there for whoever uses them. Each case runs
in a fresh interpreter: this one may have imported either module already."""

from __future__ import annotations

import subprocess
import sys
import textwrap

REAL = ("scipy.stats._stats_py", "altair.vegalite")  # loaded only with the real modules


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_gx_is_imported_without_loading_them() -> None:
    out = run(f"""
        import sys
        import settlement.validation  # GX, through the suites
        import great_expectations
        print(great_expectations.__name__, [m for m in {REAL!r} if m in sys.modules])
        """)
    assert out == "great_expectations []", out


def test_the_stand_ins_import_the_real_modules_on_first_use() -> None:
    out = run(f"""
        import math, sys
        import settlement.validation  # noqa: F401 - the stand-ins are in place
        from scipy import stats
        import altair, scipy.stats
        assert [m for m in {REAL!r} if m in sys.modules] == []
        assert math.isclose(stats.entropy([0.5, 0.5]), math.log(2))
        assert scipy.stats.norm.cdf(0) == 0.5
        assert altair.Chart.__name__ == "Chart"
        # Later imports get the real modules themselves.
        import importlib
        print(sorted(m for m in {REAL!r} if m in sys.modules),
              type(importlib.import_module("scipy.stats")).__name__)
        """)
    assert out == "['altair.vegalite', 'scipy.stats._stats_py'] module", out


def test_a_module_imported_before_is_left_as_it_is() -> None:
    out = run("""
        import sys
        import scipy.stats
        real = sys.modules["scipy.stats"]
        from settlement.validation.gximport import defer_unused
        defer_unused()
        print(sys.modules["scipy.stats"] is real, type(sys.modules["altair"]).__name__)
        """)
    assert out == "True OnFirstUse", out
