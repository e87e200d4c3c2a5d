"""``python -m hud_pipelines.cli``: the same entry point as the ``hud-pipelines`` script."""

import sys

from hud_pipelines.cli.main import main

sys.exit(main())
