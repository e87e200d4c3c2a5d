"""How ``hud-pipelines run`` takes an interrupt: SIGINT and SIGTERM noted for the exit code, and what it says.

An interrupted run writes its grades and report at once, and says how many instances it finished.
In process, the instances it did not finish keep their earlier results. On Celery workers, the units
already running finish there after the CLI has gone, and write their results: ``hud-pipelines report``
then brings the grades and the report up to date with them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
from collections.abc import Generator, Mapping, Sequence

from dagster._core.execution.execution_result import ExecutionResult


@contextlib.contextmanager
def catching_interrupts() -> Generator[dict[str, signal.Signals]]:
    """Note SIGINT / SIGTERM for the exit code; SIGTERM stops the run the way SIGINT does.

    Dagster cancels a step on SIGINT and, whenever it swaps its own SIGINT handler in, maps SIGTERM
    to that handler too, so no Python handler of ours sees every signal. The interpreter's wakeup
    file descriptor does: every signal that arrives writes its number there, whoever handles it.
    """
    received: dict[str, signal.Signals] = {}
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    os.set_blocking(read_end, False)

    def on_sigterm(signum: int, frame: object) -> None:
        signal.raise_signal(signal.SIGINT)

    def on_sigint(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm), signal.signal(signal.SIGINT, on_sigint)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield received
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        arrived = b""
        with contextlib.suppress(BlockingIOError):
            arrived = os.read(read_end, 1024)
        os.close(read_end)
        os.close(write_end)
        for candidate in (signal.SIGTERM, signal.SIGINT):  # SIGTERM first: it is re-raised as SIGINT
            if candidate in arrived:
                received["signal"] = candidate
                break


FINISHING_NOTICE = (
    b"finishing the grades, checks and report of the run before it exits: send the signal again to stop at once\n"
)


@contextlib.contextmanager
def finishing_despite_signals() -> Generator[dict[str, signal.Signals]]:
    """The first SIGINT or SIGTERM noted, not acted on, once the run ended and writes its grades, checks and report:
    a supervisor's SIGTERM after a Ctrl-C killed it between its checks and its report, whose earlier run's green
    verdict then stood beside the failed checks. A second one stops it at once (a big sweep's reports take a while).
    Entered around :func:`catching_interrupts`, whose handlers then give way to these with no gap between."""
    received: dict[str, signal.Signals] = {}

    def note(signum: int, frame: object) -> None:
        if received:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        os.write(2, FINISHING_NOTICE)  # not print: the handler may run inside a write of this thread
        received["signal"] = signal.Signals(signum)

    previous = signal.signal(signal.SIGTERM, note), signal.signal(signal.SIGINT, note)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def interrupted_line(interrupted: signal.Signals, finished: int, units: int, rest: str, *, on_workers: bool) -> str:
    """What an interrupted run says first: how far it got, what became of the rest (``rest``: how to run them).

    ``on_workers``: the run's units ran on Celery workers, where the ones already running finish.
    """
    if finished >= units:  # it came after the last instance ended, while the grades or the dataset were made
        kept = "every instance had ended, and their results are kept and graded"
    elif on_workers:
        kept = (
            "the units already running on workers finish there and write their results (then `hud-pipelines "
            "report` brings the grades up to date); the other instances keep their earlier results"
        )
    else:
        kept = (
            "the instances it did not finish keep their earlier results (one without records the episodes it finished)"
        )
    return f"run interrupted by {interrupted.name} after {finished} of {units} instance(s); {kept}{rest}"


def how_to_resume(unfinished: Sequence[str], invocation: Sequence[str], order: Sequence[str]) -> str:
    """The end of an interrupted run's line: the command that runs its ``unfinished`` instances (in ``order``)."""
    from hud_pipelines.eval.checks import rerun_command

    if not unfinished:
        return ""
    return f"; to run only those: {rerun_command(unfinished, invocation, order)}"


def how_to_resume_sweep(
    left: int, invocation: Sequence[str], asked: Mapping[str, Sequence[str]], *, rerun: bool
) -> str:
    """The end of an interrupted sweep's line, ``left`` (checkpoint, instance) pairs short: its next run evaluates
    whatever has no current result by itself, so its command is the same one again (``invocation`` with the values
    ``asked`` of each flag: the checkpoints and partitions picked). With ``--rerun``, the pairs it did not reach keep
    their results, which are current: only ``--rerun`` again evaluates them, and every pair with them."""
    if left <= 0:
        return ""
    if rerun:
        return "; the pairs it did not evaluate again keep their current results (`--rerun` evaluates every pair again)"
    command = [*invocation, *(word for flag, values in asked.items() for value in values for word in (flag, value))]
    return f"; to evaluate the rest, run the same command again: {shlex.join(command)}"


def was_interrupted(result: ExecutionResult) -> bool:
    """Whether a step of the run stopped on an interrupt (Dagster reports it as a step failure)."""
    for event in result.all_events:
        if event.event_type_value == "STEP_FAILURE":
            error = event.step_failure_data.error
            if error is not None and error.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt"):
                return True
    return result.dagster_run.status.value == "CANCELED"
