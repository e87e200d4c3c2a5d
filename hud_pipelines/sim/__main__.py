"""``python -m hud_pipelines.sim <factory> ...``: serve a sim (same as ``hud-pipelines serve``)."""

import faulthandler
import signal
import sys

# Before any import that could hang (a renderer, a simulator's GPU context): the parent asks a sim
# that missed its deadline where every thread is, and faulthandler answers even from blocked C code.
faulthandler.register(signal.SIGUSR1, all_threads=True)

from hud_pipelines.sim.serve import main  # noqa: E402

sys.exit(main())
