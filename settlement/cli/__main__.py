"""`python -m settlement.cli`: how the drills, the site's process members and the tests run
`settle` with this interpreter, installed or not."""

from __future__ import annotations

import sys

from settlement.cli import main

sys.exit(main())
