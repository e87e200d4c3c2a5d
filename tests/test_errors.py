"""Every exception the harness catches maps to the fault its episodes carry (the one place types map to faults)."""

from __future__ import annotations

import pytest

from hud_pipelines.errors import (
    ActionError,
    ContractError,
    Fault,
    PolicyLinkError,
    PolicyTimeoutError,
    RemoteError,
    RolloutTimeoutError,
    RunAborted,
    SimContractError,
    SimCrashedError,
    SimError,
    SimRefusedError,
    SimStartError,
    SimTimeoutError,
    WireError,
    fault_of,
)


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        (PolicyTimeoutError("forward ran 31 s", deadline_s=30.0), Fault.POLICY_TIMEOUT),
        (PolicyLinkError("policy server went away"), Fault.POLICY_LINK),
        (RolloutTimeoutError("instance ran 600 s", deadline_s=600.0), Fault.ROLLOUT_TIMEOUT),
        (SimStartError("no start", child_error="ContractError: feature 'x' missing"), Fault.CONTRACT),
        (SimStartError("no start", child_error="ImportError: no module envs"), Fault.SIM_START),
        (SimStartError("no start", signalled=True), Fault.SIM_START),
        (SimCrashedError("gone", returncode=-9), Fault.SIM_CRASHED),
        (SimTimeoutError("late", deadline_s=5.0), Fault.SIM_HUNG),
        (SimContractError("observation 'x' has shape (3,), expected (4,)"), Fault.CONTRACT),
        (ContractError("bad feature"), Fault.CONTRACT),
        (ActionError("action of width 2, expected 1"), Fault.ACTION),
        (RemoteError("boom", phase="step", slot=1, cause="env"), Fault.ENV),
        (RemoteError("bad frame", phase="decode"), Fault.SIM_LINK),
        (SimRefusedError("busy", status=409), Fault.SIM_LINK),
        (SimError("link failed"), Fault.SIM_LINK),
        (WireError("unknown message"), Fault.SIM_LINK),
        (KeyboardInterrupt(), Fault.INTERRUPTED),
        (SystemExit(1), Fault.INTERRUPTED),
        (RunAborted("cancelled"), Fault.INTERRUPTED),
        (ValueError("the env's own bug"), Fault.ENV),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_each_exception_type_stands_for_its_fault(exc: BaseException, fault: Fault) -> None:
    assert fault_of(exc) is fault


def test_a_sims_error_frame_says_the_phase_and_slot_and_keeps_the_sims_traceback() -> None:
    from hud_pipelines.errors import RemoteError

    whole = RemoteError(
        "env.step raised KeyError: 'a'", phase="step", remote_traceback="Traceback ...\nKeyError: 'a'\n"
    )
    assert str(whole) == (
        "sim error during step: env.step raised KeyError: 'a'\n--- sim traceback ---\nTraceback ...\nKeyError: 'a'"
    )
    assert str(RemoteError("action refused", phase="step", slot=2)) == "sim error during step, slot 2: action refused"
