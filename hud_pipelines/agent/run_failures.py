"""How a lockstep run's failures are told apart and said: the policy's own, or what ends the instance.

A policy whose own code raises on its rows ends those rows' episodes alone, as a single env's fault does: a
forward of several rows that raises is run again row by row to find them. A deadline, a lost policy server,
an abort or a sim that did not answer ends the instance; an answer of the wrong shape (the policy's reply to
the whole forward) ends every running slot.
"""

from __future__ import annotations

import logging
import weakref

import numpy as np
import numpy.typing as npt

from hud_pipelines.errors import Fault, HudPipelinesError, PolicyShapeError, RemoteError, fault_of, raised_at

log = logging.getLogger(__name__)

NOT_THE_POLICYS = frozenset({Fault.POLICY_TIMEOUT, Fault.POLICY_LINK, Fault.ROLLOUT_TIMEOUT, Fault.INTERRUPTED})
"""What a policy call can fail with that is not its own code on its rows: a deadline, its server lost, the run
aborted. Running the rows again, alone, would fail them all again."""


CODE_FAILURES = (Exception, SystemExit)
"""What the user's code (a policy, a grader) may fail with: ``sys.exit()`` in it too (:func:`code_failed`)."""


def code_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's code failing: an exception, or ``sys.exit()``; not a subclass of ``SystemExit``,
    which a framework raises to stop its worker (Celery's ``WorkerShutdown``): that one goes on up."""
    return isinstance(exc, Exception) or type(exc) is SystemExit


def raised_by_its_rows(exc: BaseException) -> bool:
    """Whether a forward's exception may come from the rows it was given, so that running them apart can tell
    which rows raise: the policy's own code raised (not a deadline, a lost server, an interrupt or an answer of
    the wrong shape, which running the rows again would meet again)."""
    return isinstance(exc, Exception) and not isinstance(exc, PolicyShapeError) and fault_of(exc) not in NOT_THE_POLICYS


class RunFailed(Exception):
    """A failure that ends every running slot with ``reason`` and ``fault`` (the run then returns)."""

    def __init__(self, reason: str, fault: Fault) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fault = fault


class PolicyFailed(RunFailed):
    """The policy (or ``adapt_chunk``) raised, timed out or answered with actions of the wrong shape."""


class SimFailed(RunFailed):
    """A step the sim did not answer: a ``SimError``, or a fault an in-process bridge raises directly."""

    @classmethod
    def of(cls, exc: HudPipelinesError) -> SimFailed:
        fault = fault_of(exc)
        if fault is Fault.ENV:  # the env's own exception says it all (``env.step raised TypeError: ...``)
            return cls(exc.message if isinstance(exc, RemoteError) else str(exc), fault)
        return cls(f"{type(exc).__name__}: {exc}", fault)

    @classmethod
    def of_reset(cls, exc: HudPipelinesError) -> tuple[str, Fault]:
        """Why a reset the sim refused ends every slot: the env's exception in its own words, as a step's says it
        (and as a sharded sim's child that raised beside others that answered), anything else as the reset's."""
        failed = cls.of(exc)
        return (failed.reason, failed.fault) if failed.fault is Fault.ENV else (f"reset failed: {exc}", failed.fault)


_SAID: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()
"""The failures already logged, per policy object: a run's instances share one, and meet the same bug."""


def say_once(policy: object, reason: str, exc: BaseException, slots: npt.NDArray[np.intp]) -> None:
    """Log a policy's failure once per run, with its traceback unless it is a clear error of ours (a wrong
    shape); the same failure again, in another instance, is a debug line (each episode's error says it)."""
    try:
        said = _SAID.setdefault(policy, set())
    except TypeError:  # a policy object that takes no weak reference: each failure is said
        said = set[str]()
    first = reason not in said
    said.add(reason)
    traceback = first and not isinstance(exc, HudPipelinesError)
    (log.error if first else log.debug)("%s, for slots %s", reason, slots.tolist(), exc_info=traceback)


def policy_failure(policy: object, what: str, exc: BaseException, slots: npt.NDArray[np.intp]) -> PolicyFailed:
    """The failure a policy's exception ends ``slots`` with: its deadline's, or its own words and the user's
    line that raised it (logged once per run)."""
    if fault_of(exc) in NOT_THE_POLICYS and not isinstance(exc, SystemExit):  # a deadline, its server lost, the run
        # aborted (a wire error is its own, and so is a sys.exit() in its code)
        return PolicyFailed(str(exc), fault_of(exc))
    where = raised_at(exc)  # the user's line, on the one line every report keeps
    reason = f"{what}: {type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")
    say_once(policy, reason, exc, slots)
    return PolicyFailed(reason, Fault.POLICY)


def build_failure(exc: BaseException, of: str) -> tuple[str, Fault]:
    """Why the policy of ``of`` could not be built, as every instance's reason (with the user's line that raised),
    logged once: its traceback unless it is a clear error of ours. A server it could not reach is its link's
    fault, anything else (``sys.exit()`` in its constructor too) the setup's."""
    where = raised_at(exc)  # the user's line, on the one line every report keeps, as a sim factory's
    reason = f"the policy could not be built: {type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")
    if isinstance(exc, HudPipelinesError):  # a clear message of ours: a traceback would bury it
        log.error("the policy of %s could not be built: %s", of, exc)
    else:
        log.error("the policy of %s could not be built", of, exc_info=exc)
    return reason, Fault.POLICY_LINK if fault_of(exc) is Fault.POLICY_LINK else Fault.SETUP
