"""``python -m hud_pipelines.sim <factory> ...``: serve a sim (same as ``hud-pipelines serve``)."""

import sys

from hud_pipelines.sim.serve import main

sys.exit(main())
