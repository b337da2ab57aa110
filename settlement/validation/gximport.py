"""Great Expectations imported without the modules it loads only for checks we never run.

``import great_expectations`` imports every expectation GX ships. Two of them load SciPy's
statistics at import time (the KL-divergence and Kolmogorov-Smirnov expectations), and one
loads Altair (their charts). That was 0.8-1.2 s of the 2.8-3.4 s of CPU the import took on
this machine, paid by every close and by every ``settle`` process that validates, on the same
two cores as the Spark JVM starting beside it. Our suites are SQL checks
(``UnexpectedRowsExpectation``) and use neither module.

``defer_unused`` therefore puts a stand-in for each in ``sys.modules``. The stand-in
imports the real module on its first attribute access, so a GX feature that does use one
still gets it, only later. ``importlib.util.LazyLoader`` is the standard tool for this,
but under Python 3.11 it does not help here: the import system reads a lazy module's
``__spec__`` whenever the module is imported again (``from scipy import stats``), and
that read loads it at once.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types

# Imported by GX's statistical expectations at import time, used only when one runs.
UNUSED = ("scipy.stats", "altair")

# Re-entrant: the import of one deferred module may read another's stand-in.
_load_lock = threading.RLock()


class OnFirstUse(types.ModuleType):
    """A module's stand-in: the real module is imported when an attribute is first read."""

    def __init__(self, name: str):
        super().__init__(name)
        # Read by the import system when the name is imported again: as a plain attribute,
        # so that reading it does not import the real module.
        self.__spec__ = None
        self._real: types.ModuleType | None = None

    def __getattr__(self, attr: str) -> object:
        # Called only for attributes the stand-in lacks: everything of the real module's.
        return getattr(self.real_module(), attr)

    def real_module(self) -> types.ModuleType:
        with _load_lock:
            if self._real is None:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                self._real = importlib.import_module(self.__name__)
            return self._real


def defer_unused(names: tuple[str, ...] = UNUSED) -> None:
    """Stand-ins for ``names`` not imported yet (call before ``import great_expectations``).
    A dotted name's parent package is imported now (SciPy's is small): ``import a.b``
    must find ``a``."""
    for name in names:
        if name in sys.modules:
            continue
        parent = name.rpartition(".")[0]
        if parent:
            importlib.import_module(parent)
        sys.modules[name] = OnFirstUse(name)
