"""The exceptions hud-pipelines raises, all of them here, and the faults an errored episode carries.

One hierarchy so callers can catch ``HudPipelinesError`` at a boundary (the CLI, a Dagster asset) and
still tell the cases apart where it matters: a bad input (contract, factory, task argument, action)
is the user's to fix; a sim fault (start-up, crash, timeout, remote error) ends the affected episodes
as *errored*, never as failed.
"""

from __future__ import annotations

import re
import signal
import traceback
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

LIBRARY_FILE = re.compile(r"[/\\](site-packages|dist-packages|lib[/\\]python3\.\d+)[/\\]|^<frozen ")
"""Files of an installed package or of the standard library (of any interpreter: a sim may run under its own)."""
PACKAGE_DIR = str(Path(__file__).resolve().parent)
"""This package's folder: its frames are the harness around the user's code."""


def is_user_file(file: str) -> bool:
    """Whether a traceback's ``file`` is the user's code: neither this package's, the standard library's nor an
    installed package's (where to look first when the user's code raised)."""
    return not LIBRARY_FILE.search(file) and PACKAGE_DIR not in file


def raised_at(exc: BaseException) -> str | None:
    """Where in the user's code ``exc``, or an exception it was raised from, was raised (``/p/policy.py:12 in
    __init__``): the innermost such frame of the innermost exception that has one; ``None`` when none does."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for link in reversed(chain):  # the root cause first
        frames = [f for f in traceback.extract_tb(link.__traceback__) if is_user_file(f.filename)]
        if frames:
            return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}"
    return None


class Phase(StrEnum):
    """Where an error happened; carried by every error frame."""

    HANDSHAKE = "handshake"
    """The first frame was not an acceptable ``hello`` (the server closes with 1002 after it)."""
    DECODE = "decode"
    """A frame could not be decoded or is not a valid request; nothing reached the sim."""
    SEQUENCE = "sequence"
    """A request's ``seq`` was not above the previous one (duplicate or replayed); it was not run."""
    RESET = "reset"
    STEP = "step"
    RESULT = "result"
    SERVER = "server"
    """The server itself failed (for example it is shutting down)."""


class HudPipelinesError(Exception):
    """Base class of every error raised on purpose by hud-pipelines."""


class ContractError(HudPipelinesError):
    """A contract cannot be derived, loaded or merged, or a frame does not match it."""


class FactoryError(HudPipelinesError):
    """A sim factory spec cannot be resolved to something that builds an env."""


class TaskArgumentError(HudPipelinesError):
    """A task argument is accepted neither by the factory nor by ``reset``."""


class ActionError(HudPipelinesError):
    """An action frame does not match the contract (shape, dtype, finiteness, bounds)."""


class WireError(HudPipelinesError):
    """A frame cannot be decoded, or breaks the protocol (type, version, sequence, size)."""


class DatasetFitError(ContractError):
    """The dataset section does not fit the contract (``state_features`` it lacks): refused before any rollout."""


class SimContractError(WireError, ContractError):
    """A sim's frame does not fit its announced contract: the link is not trusted, the instance ends (``contract``)."""


class SlotStateError(HudPipelinesError):
    """An operation is illegal in a slot's current lifecycle state."""


class SimError(HudPipelinesError):
    """The sim, or the link to it, failed; the episodes it was running end as errored."""

    server: str | None = None
    """The served sim (its URL) the error came from, where the pool attached to one: an instance that
    never got a sim still records which server it tried."""


class SimStartError(SimError):
    """The sim child did not come up within its start-up deadline (its stderr is attached).

    ``child_error`` is the child's own last error line (``ContractError: feature 'x' ...``) when it
    wrote one; the message starts with it, before the stderr tail. ``signalled``: a signal ended the
    child without an error line of its own (an out-of-memory kill), which another start may not meet.
    """

    def __init__(self, message: str, *, child_error: str | None = None, signalled: bool = False) -> None:
        super().__init__(message)
        self.child_error = child_error
        self.signalled = signalled

    @property
    def child_error_type(self) -> str | None:
        """The exception class the child reported (``ContractError``): its error line is ``<Type>: <message>``."""
        name = self.child_error.split(":", 1)[0].strip() if self.child_error and ":" in self.child_error else ""
        return name if name.isidentifier() else None


class SimRefusedError(SimError):
    """The sim refused the connection before the WebSocket handshake (HTTP 401: token, 409: busy).

    ``running_for_s``: of a 409, how long the sim has run a request of a connection that has gone (``None``: a
    live connection drives it), for the client to judge by its own step deadline whether the sim hung.
    """

    def __init__(self, message: str, *, status: int, running_for_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.running_for_s = status, running_for_s


class SimCrashedError(SimError):
    """The sim child died, or the connection to it dropped, while a request was in flight.

    ``returncode`` is the child's exit status when it is known to have exited (negative: killed by
    that signal; ``None``: alive, or not ours to know, e.g. an attached sim).
    """

    def __init__(self, message: str, *, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode

    @property
    def signal_name(self) -> str | None:
        """The signal that killed the child (``"SIGKILL"`` for returncode -9), if a signal did."""
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"


class SimTimeoutError(SimError):
    """A request to the sim missed its deadline (``deadline_s``); a spawned child's process group is killed."""

    def __init__(self, message: str, *, deadline_s: float | None = None) -> None:
        super().__init__(message)
        self.deadline_s = deadline_s


class RemoteError(SimError):
    """The sim answered a request with an error frame.

    ``phase`` is where it happened (``handshake``, ``decode``, ``reset``, ``step``, ...), ``slot``
    the affected slot (``None`` when it concerns the whole batch) and ``remote_traceback`` the
    formatted traceback from the sim process when an exception caused it.
    """

    def __init__(
        self,
        message: str,
        *,
        phase: str,
        slot: int | None = None,
        remote_traceback: str | None = None,
        cause: str | None = None,
    ) -> None:
        text = f"sim error during {phase if slot is None else f'{phase}, slot {slot}'}: {message}"
        if remote_traceback:
            text = f"{text}\n--- sim traceback ---\n{remote_traceback.rstrip()}"
        super().__init__(text)
        self.message = message
        self.phase = phase
        self.slot = slot
        self.remote_traceback = remote_traceback
        self.cause = cause
        """``env`` when the env's own code raised (the wire's ``cause``): the env's fault, not the link's."""


class PolicyTimeoutError(HudPipelinesError):
    """A policy forward did not return within ``agent.forward_timeout_s``."""

    def __init__(self, message: str, *, deadline_s: float) -> None:
        super().__init__(message)
        self.deadline_s = deadline_s


class RolloutTimeoutError(HudPipelinesError):
    """An instance ran past ``rollout_timeout_s`` (its sim is stopped, a forward it waits on abandoned)."""

    def __init__(self, message: str, *, deadline_s: float) -> None:
        super().__init__(message)
        self.deadline_s = deadline_s


class RunAborted(HudPipelinesError):
    """The run is shutting down (SIGINT, SIGTERM, a Dagster termination) while this call waited."""


class Fault(StrEnum):
    """Why an episode errored, set where the exception is caught (never read back from a message).

    The first group ends one slot and its siblings go on; the second ends the whole instance (every
    slot still running errors, and the instance is reported as failed).
    """

    ENV = "env"
    """The slot's own env raised during reset or step."""
    NONFINITE = "nonfinite"
    """The slot's observation or reward held NaN or infinity."""
    POLICY = "policy"
    """The policy raised, or returned an action that cannot be sent (not finite, wrong shape)."""
    ACTION = "action"
    """The sim refused the slot's action (shape, dtype, bounds)."""
    GRADER = "grader"
    """A callable grader raised or returned something that is not a grade."""
    POLICY_TIMEOUT = "policy_timeout"
    """A policy forward ran past ``agent.forward_timeout_s``."""
    POLICY_LINK = "policy_link"
    """The remote policy server could not be reached, or its connection dropped (no episode's doing)."""
    ROLLOUT_TIMEOUT = "rollout_timeout"
    """The instance ran past ``rollout_timeout_s``; its sim was stopped."""
    SETUP = "setup"
    """The policy or a grader could not be built or loaded (its error is the reason)."""
    SIM_START = "sim_start"
    """The sim did not start (its own error line is the reason)."""
    SIM_CRASHED = "sim_crashed"
    """The sim process died or its connection dropped."""
    SIM_HUNG = "sim_hung"
    """The sim missed a step or reset deadline (``step_timeout_s``)."""
    SIM_LINK = "sim_link"
    """The sim broke the protocol or answered the whole batch with an error."""
    CONTRACT = "contract"
    """The sim's observations or actions do not fit the pipeline's contract."""
    INTERRUPTED = "interrupted"
    """The run was cancelled (SIGINT, SIGTERM, a Dagster termination), or its eval step failed (its reason
    says how), before the episode ended."""
    WORKER_LOST = "worker_lost"
    """The worker process running the instance (a unit on a Celery worker) died before the instance ended."""
    NOT_RUN = "not_run"
    """The instance has no result of the configuration being graded (never ran, or ran under another)."""

    @property
    def ends_instance(self) -> bool:
        """Whether this fault stops every slot of the instance (rather than one slot)."""
        return self not in _SLOT_FAULTS


_SLOT_FAULTS = frozenset({Fault.ENV, Fault.NONFINITE, Fault.POLICY, Fault.ACTION, Fault.GRADER})


class PolicyError(HudPipelinesError):
    """A policy cannot be built, or its output does not fit the contract."""


class PolicyShapeError(PolicyError):
    """Actions of another shape than a forward's rows need: its answer to them all (never run again row by row)."""


class PolicyLinkError(PolicyError):
    """The remote policy server cannot be reached, refused the connection or went away: the instance fails
    (as when its sim dies), so a run that lost its server keeps the results it had instead of errored rows."""


_FAULT_BY_TYPE: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], Fault], ...] = (
    (PolicyTimeoutError, Fault.POLICY_TIMEOUT),
    (PolicyLinkError, Fault.POLICY_LINK),
    (RolloutTimeoutError, Fault.ROLLOUT_TIMEOUT),
    (SimStartError, Fault.SIM_START),
    (SimCrashedError, Fault.SIM_CRASHED),
    (SimTimeoutError, Fault.SIM_HUNG),
    (ContractError, Fault.CONTRACT),
    (ActionError, Fault.ACTION),
    ((SimError, WireError), Fault.SIM_LINK),
    ((KeyboardInterrupt, SystemExit, RunAborted), Fault.INTERRUPTED),
)
"""Exception types and the fault each stands for; the first row an exception is an instance of wins, so a
subclass stands before its base (``SimContractError`` is a wire error, but the contract's fault)."""


def fault_of(exc: BaseException) -> Fault:
    """The fault an exception stands for, by its type (the one place where types map to faults).

    Two cases read more than the type: a sim that refused the contract as it started is the contract's fault,
    and an error the env's own code raised in the sim, carried over the wire, is the env's. Anything no row
    names is the env's too (what the sim's side raised that this package does not know)."""
    if isinstance(exc, SimStartError) and exc.child_error_type == "ContractError":
        return Fault.CONTRACT
    if isinstance(exc, RemoteError) and exc.cause == "env":
        return Fault.ENV
    return next((fault for kinds, fault in _FAULT_BY_TYPE if isinstance(exc, kinds)), Fault.ENV)


class GraderError(HudPipelinesError):
    """A callable grader failed or returned something that is not a grade."""


class EnvFault(HudPipelinesError):
    """The env's own code raised; the affected episodes are already marked errored."""

    def __init__(self, phase: Phase, message: str, *, slot: int | None, formatted: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.slot = slot
        self.formatted = formatted


class SimShuttingDown(HudPipelinesError):
    """A sim touch was requested after the main thread stopped serving."""


class DatasetWriteError(HudPipelinesError):
    """A dataset writer failed; the episodes it had committed stay in its finalized part."""


class EmptyDatasetError(DatasetWriteError):
    """There is no episode to merge: nothing was recorded, or every episode was left out."""


class EpisodeVideoError(HudPipelinesError):
    """An episode's video could not be written whole."""


class CheckpointError(HudPipelinesError):
    """A sweep's checkpoints cannot be used: a path that does not exist, a folder without any, a label twice."""


class ConfigurationError(HudPipelinesError):
    """A run's resource configuration (a launchpad or run-config override) is not a valid pipeline section."""

    def __init__(self, message: str, *, errors: Sequence[ErrorDetails] = ()) -> None:
        super().__init__(message)
        self.errors = tuple(errors)
        """pydantic's details of each problem; ``loc`` is its key in the pipeline (``("sim", "num_envs")``), so
        whoever set the value (a deployment file) can name its own line."""


class DeploymentError(HudPipelinesError):
    """The deployment file cannot be read or names something that is not a resource field."""

    def __init__(self, message: str, *, checked: dict[str, dict[str, dict[str, object]]] | None = None) -> None:
        super().__init__(message)
        self.checked = checked or {}
        """What of a file whose fields are wrong was read right (pipeline -> part -> fields): its pipeline names,
        and its sections as far as they go, can still be checked, so that every problem is said at once."""


class LinkError(HudPipelinesError):
    """Base class of the link's own failures."""


class LinkRefused(LinkError):
    """The server answered the opening handshake with an HTTP status other than 101."""

    def __init__(self, status: int, body: str, running_for_s: float | None = None) -> None:
        super().__init__(f"HTTP {status} {body}".strip())
        self.status, self.body, self.running_for_s = status, body, running_for_s


class LinkClosed(LinkError):
    """The connection is closed or broken; ``code``: the peer's close code, or this side's where it refused a frame
    (``refused_here``)."""

    def __init__(self, message: str, code: int | None = None, reason: str = "", *, refused_here: bool = False) -> None:
        super().__init__(message)
        self.code, self.reason, self.refused_here = code, reason, refused_here


def exception_line(formatted: str) -> str:
    """The exception a formatted traceback ends with, in one line: its type and its whole message (a
    simulator's message often spans lines, the cause on the first: ``MuJoCo Warning: Nan ... QACC``)."""
    lines = formatted.strip().splitlines()
    summary: list[str] = []
    for line in reversed(lines):
        if line.startswith((" ", "\t", "Traceback (most recent call last)")):
            break
        summary.append(line.strip())
    return " ".join(line for line in reversed(summary) if line) or (lines[-1] if lines else formatted)
