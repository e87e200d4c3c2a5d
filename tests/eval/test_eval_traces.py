"""An eval's traces speak the contract's language: the per-dimension names a user gave in contract.json."""

from __future__ import annotations

import json
from pathlib import Path

from hud_pipelines.eval.steps import evaluate
from hud_pipelines.recording.trace_reader import iter_jobs, read_traces
from hud_pipelines.recording.traces import StepType
from hud_pipelines.spec.loader import load_pipeline_text

REPO = Path(__file__).resolve().parents[2]
STATE_NAMES = ["cart_x", "cart_v", "pole_angle", "pole_omega"]
ACTION_NAMES = ["push_right"]


def test_traces_carry_the_edited_names_of_state_and_action(tmp_path: Path) -> None:
    pipeline = tmp_path / "named.yaml"
    text = json.dumps(
        {
            "name": "named",
            "sim": {"factory": "CartPole-v1", "num_envs": 2, "contract": "contracts/named.json"},
            "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
            "max_steps": 5,
        }
    )
    pipeline.write_text(text)
    spec = load_pipeline_text(text, source=pipeline)
    first = evaluate(spec, outputs_dir=tmp_path / "first", project_dir=REPO)  # writes the derived contract
    assert not first.failed_instances
    contract_file = tmp_path / "contracts" / "named.json"
    edited = json.loads(contract_file.read_text())
    assert edited["features"]["state"]["names"] != STATE_NAMES
    edited["features"]["state"]["names"] = STATE_NAMES
    edited["features"]["action"]["names"] = ACTION_NAMES
    contract_file.write_text(json.dumps(edited))

    evaluation = evaluate(spec, outputs_dir=tmp_path / "out", project_dir=REPO)
    assert not evaluation.failed_instances
    (run,) = (evaluation.outputs.base / "traces").iterdir()
    (job,) = iter_jobs(run)
    traces = read_traces(job)
    assert len(traces) == 2
    for trace in traces:
        assert trace.header["state_names"] == {"state": STATE_NAMES}
        assert trace.header["action_names"] == ACTION_NAMES
        observation = trace.of_type(StepType.OBSERVATION)[0]
        assert list(observation["state"]["state"]) == STATE_NAMES
        assert list(trace.of_type(StepType.ACTION)[0]["action"]) == ACTION_NAMES
        assert trace.of_type(StepType.INFERENCE)[0]["names"] == ACTION_NAMES
