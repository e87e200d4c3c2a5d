"""Faults x stages x where, each run as a real Dagster job, each checked against the same invariants.

Whatever breaks (the sim at start-up, reset or step; the policy's forward; one slot, one instance
or every instance), a run that starts ends with: one grade row per scheduled episode, each naming
its run; ``scheduled == succeeded + failed + errored``; errored rows carrying the fault and a reason
that names the cause; grades, checks and the report written; a dataset published exactly when the
blocking checks pass, loadable by lerobot with as many frames and actions as rows and finite stats;
and no sim process left behind. The run fails (exit non-zero) exactly when an instance failed or no
episode produced an answer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from hud_pipelines.dagster.definitions import definitions_for_file
from hud_pipelines.errors import Fault
from hud_pipelines.eval.grades import GradeRow, summarize
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.recording.events import EpisodeStatus
from hud_pipelines.spec.models import PipelineSpec
from tests.dagster.support import REPO, SIMS, sim_label, sim_processes

NUM_ENVS = 2
GROUP = 2
# seeds are instance * NUM_ENVS + slot: seed 3 is instance 1, slot 1
ONE_SLOT = 3
ONE_INSTANCE = 2  # instance 1, slot 0: an instance-wide fault there fails instance 1 only


@dataclass(frozen=True)
class Case:
    """A fault, where it is planted, and what the grades must say."""

    sim: dict[str, Any]
    policy: dict[str, Any] = field(default_factory=lambda: {"kind": "constant"})
    errored: dict[int, Fault] = field(default_factory=dict[int, Fault])
    """Seed -> the fault its row must carry; every other row must be graded."""
    reason: str = ""
    """Text the errored rows' reason must contain (it names the cause)."""
    fields: dict[str, Any] = field(default_factory=dict[str, Any])


EVERY_SEED = range(NUM_ENVS * GROUP)
CASES = {
    "start-up/raise/every": Case(
        {"fault": "raise_build"},
        errored=dict.fromkeys(EVERY_SEED, Fault.SIM_START),
        reason="FaultyEnv refused to build",
    ),
    "start-up/hang/every": Case(
        {"fault": "hang_build"},
        errored=dict.fromkeys(EVERY_SEED, Fault.SIM_START),
        reason=f"did not become ready within 3 s, stuck at {REPO / 'envs' / 'faulty.py'}:",  # where, on every row
        fields={"sim": {"startup_timeout_s": 3}},
    ),
    "start-up/policy/every": Case(
        {},
        policy={"kind": "scripted", "target": "tests.eval.dynamic_targets:Policy"},  # one only the run can tell
        errored=dict.fromkeys(EVERY_SEED, Fault.SETUP),
        reason="the policy could not be built",
    ),
    "start-up/policy-init/every": Case(  # the user's line that raised, as a sim factory's is named
        {},
        policy={"kind": "scripted", "target": "tests.eval.faulty_policies:RefusesToBuild"},
        errored=dict.fromkeys(EVERY_SEED, Fault.SETUP),
        reason="weights are missing (at " + str(Path(__file__).with_name("faulty_policies.py")) + ":",
    ),
    "start-up/policy-exit/every": Case(  # before, the run's interrupt: every instance "interrupted", unnamed
        {},
        policy={"kind": "scripted", "target": "tests.eval.faulty_policies:ExitsToBuild"},
        errored=dict.fromkeys(EVERY_SEED, Fault.SETUP),
        reason="the policy could not be built: SystemExit: 2 (at "
        + str(Path(__file__).with_name("faulty_policies.py")),
    ),
    "reset/policy-reset/every": Case(  # before, "interrupted", its words only in the console
        {},
        policy={"kind": "scripted", "target": "tests.eval.faulty_policies:RaisesInReset"},
        errored=dict.fromkeys(EVERY_SEED, Fault.POLICY),
        fields={"max_concurrent": 1},  # each instance alone: the policy is reset before each
        reason="policy reset failed: RuntimeError: the policy's reset failed on purpose (at "
        + str(Path(__file__).with_name("faulty_policies.py"))
        + ":",
    ),
    "start-up/grader/every": Case(
        {},
        errored=dict.fromkeys(EVERY_SEED, Fault.SETUP),
        reason="dynamic_targets has no attribute 'grade'",
        fields={"graders": [{"kind": "callable", "target": "tests.eval.dynamic_targets:grade"}]},
    ),
    "grade/nan-score/slot": Case(
        {},
        errored={ONE_SLOT: Fault.GRADER},
        reason="not finite",
        fields={
            "graders": [
                {"kind": "callable", "target": f"{Path(__file__).with_name('faulty_policies.py')}:nan_for_seed_3"}
            ]
        },
    ),
    "grade/nan-score-of-another-grader/slot": Case(
        {},
        errored={ONE_SLOT: Fault.GRADER},
        reason="grader 'nan' gave a score that is not finite",
        fields={
            "graders": [
                {"kind": "return", "threshold": 5},
                {
                    "kind": "callable",
                    "name": "nan",
                    "target": f"{Path(__file__).with_name('faulty_policies.py')}:nan_for_seed_3",
                },
            ]
        },
    ),
    "reset/raise/slot": Case(
        {"fault": "raise_reset", "fault_seed": ONE_SLOT},
        errored={ONE_SLOT: Fault.ENV},
        reason="reset failed on purpose",
    ),
    "reset/hang/instance": Case(
        {"fault": "hang_reset", "fault_seed": ONE_INSTANCE},
        errored={ONE_INSTANCE: Fault.SIM_HUNG, ONE_INSTANCE + 1: Fault.SIM_HUNG},
        reason="3",
        fields={"sim": {"step_timeout_s": 3}},
    ),
    "step/raise/slot": Case(
        {"fault": "raise_step", "fault_seed": ONE_SLOT}, errored={ONE_SLOT: Fault.ENV}, reason="failed on purpose"
    ),
    "step/hang/instance": Case(
        {"fault": "hang_step", "fault_seed": ONE_INSTANCE},
        errored={ONE_INSTANCE: Fault.SIM_HUNG, ONE_INSTANCE + 1: Fault.SIM_HUNG},
        reason="3",
        fields={"sim": {"step_timeout_s": 3}},
    ),
    "step/crash/instance": Case(
        {"fault": "crash_step", "fault_seed": ONE_INSTANCE},
        errored={ONE_INSTANCE: Fault.SIM_CRASHED, ONE_INSTANCE + 1: Fault.SIM_CRASHED},
        reason="SIGKILL",
    ),
    "step/nan-observation/slot": Case(
        {"fault": "nan_step", "fault_seed": ONE_SLOT},
        errored={ONE_SLOT: Fault.NONFINITE},
        reason="not finite (seed 3, step 2)",
    ),
    "step/nan-reward/slot": Case(
        {"fault": "nan_reward_step", "fault_seed": ONE_SLOT},
        errored={ONE_SLOT: Fault.NONFINITE},
        reason="reward nan is not finite (seed 3, step 2)",
    ),
    "step/slow/instance": Case(
        {"fault": "slow_step", "fault_seed": ONE_INSTANCE, "delay_s": 1.0},
        errored={ONE_INSTANCE: Fault.ROLLOUT_TIMEOUT, ONE_INSTANCE + 1: Fault.ROLLOUT_TIMEOUT},
        reason="rollout_timeout_s=3",
        fields={"rollout_timeout_s": 3},
    ),
    "forward/raise/slot": Case(  # its sibling, in the same forward, used to end with it
        {},
        policy={
            "kind": "scripted",
            "target": "tests.eval.faulty_policies:Faulty",
            "args": {"mode": "raise", "seed": 2},
        },
        errored={ONE_INSTANCE: Fault.POLICY},
        reason="failed on purpose for seed 2",
    ),
    "forward/raise/every": Case(
        {},
        policy={"kind": "scripted", "target": "tests.eval.faulty_policies:AlwaysRaises"},
        errored=dict.fromkeys(EVERY_SEED, Fault.POLICY),
        reason="failed on purpose in every forward",
    ),
    "forward/nan-action/slot": Case(
        {},
        policy={"kind": "scripted", "target": "tests.eval.faulty_policies:Faulty", "args": {"mode": "nan", "seed": 3}},
        errored={ONE_SLOT: Fault.POLICY},
        reason="non-finite action for step 1",  # steps count from 1, as an env's faults say them
    ),
    "forward/hang/instance": Case(
        {},
        policy={
            "kind": "scripted",
            "target": "tests.eval.faulty_policies:Faulty",
            "args": {"mode": "sleep", "seed": 2, "seconds": 60},
        },
        errored={ONE_INSTANCE: Fault.POLICY_TIMEOUT, ONE_INSTANCE + 1: Fault.POLICY_TIMEOUT},
        reason="forward_timeout_s=2",
        # the other instance shares the policy: it must not wait behind the stuck forward
        fields={"agent": {"forward_timeout_s": 2}},
    ),
}


def _pipeline(tmp_path: Path, name: str, case: Case, label: str) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "sim": {"factory": f"{SIMS}:faulty", "num_envs": NUM_ENVS, "args": {"label": label, **case.sim}},
        "agent": {"policy": case.policy},
        "group": GROUP,
        "max_concurrent": 2,
        "max_steps": 20,
        "graders": [{"kind": "return", "threshold": 5}],
        "dataset": {"root": str(tmp_path / "dataset"), "repo_id": f"local/{name}"},
    }
    for key, value in case.fields.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) else value
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("name", list(CASES))
def test_every_fault_ends_as_data_with_a_report_and_nothing_left_behind(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    case = CASES[name]
    label = sim_label(tmp_path)
    pipeline = name.replace("/", "_").replace("-", "_")
    path = _pipeline(tmp_path, pipeline, case, label)
    outputs = EvalOutputs(tmp_path / "outputs", pipeline)
    defs = definitions_for_file(path, outputs_dir=outputs.root, project_dir=REPO)
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(pipeline).execute_in_process(instance=instance, raise_on_error=False)
        failed_partitions = {p for p in (f"task0-i{i}" for i in range(GROUP))} - instance.get_materialized_partitions(
            dg.AssetKey([pipeline, "rollouts"])
        )

    rows = [GradeRow.from_dict(r) for r in json.loads(outputs.grades_json.read_text())]
    summary = summarize(rows)
    assert summary.scheduled == NUM_ENVS * GROUP == len(rows)
    assert summary.scheduled == summary.succeeded + summary.failed + summary.errored
    assert {r.run_id for r in rows} == {result.run_id}, "every row names the run that produced it"
    by_seed = {r.seed: r for r in rows}
    for seed, row in by_seed.items():
        if seed in case.errored:
            assert row.status is EpisodeStatus.ERRORED, (seed, row)
            assert row.fault is case.errored[seed], (seed, row.fault, row.error)
            assert case.reason in (row.error or ""), (seed, row.error)
        else:
            assert row.status is EpisodeStatus.SUCCEEDED, (seed, row.error)
    assert outputs.report_md.is_file()
    assert f"Scheduled {summary.scheduled} = succeeded" in outputs.report_md.read_text()
    checks = {c["name"]: c["passed"] for c in json.loads(outputs.checks_json.read_text())}
    instance_failed = any(fault.ends_instance for fault in case.errored.values())
    answered = len(case.errored) < summary.scheduled
    assert checks["instances_completed"] is not instance_failed
    assert checks["episodes_answered"] is answered, "a run with no answered episode has no result"
    run_failed = instance_failed or not answered
    assert result.success is not run_failed
    expected_failed = {r.group_id for r in rows if r.fault is not None and r.fault.ends_instance}
    assert failed_partitions == expected_failed, "exactly the failed instances stay unmaterialized"

    published = tmp_path / "dataset"
    if run_failed:
        assert not (published / "meta" / "info.json").exists(), "a failed eval publishes no dataset"
    else:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        dataset = LeRobotDataset(f"local/{pipeline}", root=published)
        graded = [r for r in rows if r.status is not EpisodeStatus.ERRORED]
        assert dataset.num_episodes == len(graded)
        assert dataset.num_frames == sum(r.steps for r in graded)
        assert len(dataset.hf_dataset["action"]) == dataset.num_frames
        stats = json.loads((published / "meta" / "stats.json").read_text())
        assert all(math.isfinite(v) for s in stats.values() for vs in s.values() for v in _flat(vs))
    assert not sim_processes(label)


def _flat(value: Any) -> list[float]:
    if isinstance(value, list):
        return [x for item in value for x in _flat(item)]
    return [float(value)]


def test_a_policy_that_raises_in_every_instance_is_logged_once_with_its_traceback_and_named_at_its_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.eval.steps import evaluate

    monkeypatch.chdir(REPO)
    spec = _scripted_cartpole(tmp_path, "raises", "AlwaysRaises", num_envs=2, max_concurrent=1, max_steps=5)
    logger = "hud_pipelines.agent.run_failures"
    with caplog.at_level("DEBUG", logger=logger):
        evaluation = evaluate(spec, outputs_dir=tmp_path)
    said = [r for r in caplog.records if r.name == logger and "policy failed" in r.getMessage()]
    # once per episode (a forward that raised is run row by row to find the rows it raised on), said once
    assert [(r.levelname, bool(r.exc_info)) for r in said] == [("ERROR", True)] + [("DEBUG", False)] * (
        len(evaluation.rows) - 1
    )
    line = f"{REPO / 'tests' / 'eval' / 'faulty_policies.py'}:52 in __call__"
    assert {row.error for row in evaluation.rows} == {
        f"policy failed: RuntimeError: the policy failed on purpose in every forward (at {line})"
    }, "each episode's error names the policy's line"


def test_the_readmes_table_of_faults_names_every_fault_and_what_it_ends() -> None:
    """A report's reader looks a fault up in the README: every fault is there, each with what it ends."""
    rows = re.findall(r"^  \| `(\w+)` \| .+ \| the (slot|instance) \|$", (REPO / "README.md").read_text(), re.MULTILINE)
    assert [name for name, _ in rows] == [fault.value for fault in Fault]
    assert {name: ends == "instance" for name, ends in rows} == {fault.value: fault.ends_instance for fault in Fault}


def test_instances_that_fail_alike_say_the_reason_once_and_name_their_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a checkpoint whose policy could not be built logged its whole reason once per instance, naming
    the instance without the checkpoint: eight like lines, which of the sweep's checkpoints unsaid."""
    from hud_pipelines.dagster.resources import pipeline_resources
    from hud_pipelines.eval.rollouts import rollouts_step

    monkeypatch.chdir(REPO)
    spec = _scripted_cartpole(tmp_path, "unbuilt", "RefusesToBuild", num_envs=1)
    parts = pipeline_resources(spec, project_dir=REPO)
    try:
        with caplog.at_level("ERROR"):
            results = rollouts_step(
                spec,
                parts.sim.pool(spec),
                EvalOutputs(tmp_path, spec.name),
                run_id="r",
                partitions=spec.partitions(),
                checkpoint="step_9",
            )
    finally:
        parts.sim.close()
    assert {result.fault for result in results} == {Fault.SETUP}
    said = [r.getMessage() for r in caplog.records if r.name.startswith(("hud_pipelines.eval", "hud_pipelines.agent"))]
    assert said.pop(0) == "the policy of unbuilt (checkpoint step_9) could not be built", said
    first = "instance step_9|task0-i0 of unbuilt failed (setup): the policy could not be built: FileNotFoundError: "
    assert said[0].startswith(first), said
    assert said[1:] == [
        f"instance step_9|task0-i{i} of unbuilt failed (setup): as instance step_9|task0-i0" for i in (1, 2)
    ], said


def test_a_sim_that_hangs_at_start_up_says_where_on_every_row_and_its_stacks_once_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, every row and log line said only "did not become ready within 3 s": the stacks the sim was
    stuck in, dumped before it was killed, reached only the Dagster event log."""
    from hud_pipelines.dagster.resources import pipeline_resources
    from hud_pipelines.eval.rollouts import rollouts_step
    from hud_pipelines.spec.loader import load_pipeline_text

    monkeypatch.chdir(REPO)
    label = sim_label(tmp_path)
    text = {
        "name": "stuck",
        "sim": {"factory": f"{SIMS}:faulty", "args": {"label": label, "fault": "hang_build"}, "startup_timeout_s": 3},
        "agent": {"policy": {"kind": "constant"}},
        "group": 2,
    }
    spec = load_pipeline_text(json.dumps(text), source=tmp_path / "stuck.yaml")
    parts = pipeline_resources(spec, project_dir=REPO)
    try:
        with caplog.at_level("ERROR", logger="hud_pipelines.eval.runner"):
            results = rollouts_step(
                spec, parts.sim.pool(spec), EvalOutputs(tmp_path, spec.name), run_id="r", partitions=spec.partitions()
            )
    finally:
        parts.sim.close()
    source = (REPO / "envs" / "faulty.py").read_text().splitlines()
    hang = next(i for i, line in enumerate(source, 1) if "HANG_BUILD:" in line and "if" in line) + 1
    where = f"stuck at {REPO / 'envs' / 'faulty.py'}:{hang} in __init__"
    assert all(where in (row.error or "") for result in results for row in result.rows), [r.error for r in results]
    said = [r.getMessage() for r in caplog.records if r.name == "hud_pipelines.eval.runner"]
    assert len(said) == 2, said
    assert said[0].startswith("instance task0-i0 of stuck failed (sim_start): the sim did not become ready"), said
    assert where in said[0].splitlines()[0]
    assert "(most recent call first)" in said[0], "the stacks it was stuck in"
    assert said[1] == "instance task0-i1 of stuck failed (sim_start): as instance task0-i0", "the stacks once"
    assert not sim_processes(label)


def _scripted_cartpole(tmp_path: Path, name: str, policy: str, **fields: Any) -> PipelineSpec:
    """Three instances of CartPole driven by a policy of ``tests/eval/faulty_policies.py``."""
    from hud_pipelines.spec.loader import load_pipeline_text

    text = {
        "name": name,
        "sim": {"factory": f"{SIMS}:cartpole", "num_envs": fields.pop("num_envs")},
        "agent": {"policy": {"kind": "scripted", "target": f"tests.eval.faulty_policies:{policy}"}},
        "group": 3,
        **fields,
    }
    return load_pipeline_text(json.dumps(text), source=tmp_path / f"{name}.yaml")
