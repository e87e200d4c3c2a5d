"""A writing process for the cancellation test: publishes nothing, writes until it is terminated.

Run as ``python -m tests.dataset.sigterm_writer <target>``; prints ``READY`` once
episodes have been committed, then keeps writing until SIGTERM arrives.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import time
from pathlib import Path

from hud_pipelines.dataset.publish import DatasetBuild
from hud_pipelines.spec.dataset_options import DatasetOptions
from tests.dataset.support import SPEC, write_episodes


def main(target: Path) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for the stacks of a writer that hangs
    with DatasetBuild(target, SPEC, fps=10, options=DatasetOptions(writers=2)) as build:
        sink = build.sink("instance-0")
        write_episodes(sink, 6)
        while sink.report.episodes_written < 6:
            time.sleep(0.05)
        print("READY", build.staging, flush=True)
        episode = 6
        while True:  # an endless eval; only a signal ends it
            write_episodes(sink, 1, first=episode)
            episode += 1
            time.sleep(0.01)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
