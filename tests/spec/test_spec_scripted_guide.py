"""The YAML reference's account of scripted policies holds: its example runs, its input description is true."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pytest

from hud_pipelines.contract import load_contract
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.spec import load_pipeline, load_pipeline_text
from hud_pipelines.spec.schema import REFERENCE_FILE

ROOT = Path(__file__).resolve().parents[2]
GUIDE_HEADING = "### What a scripted policy receives and returns"
CAMERA_PENDULUM = f"{ROOT / 'envs' / 'camera_pendulum.py'}:camera_pendulum"


def guide() -> str:
    """The scripted-policy guide as committed in the YAML reference (what users read)."""
    reference = (ROOT / REFERENCE_FILE).read_text(encoding="utf-8")
    assert GUIDE_HEADING in reference
    return reference.split(GUIDE_HEADING, 1)[1].split("\n## ", 1)[0]


def code_block(text: str, language: str) -> str:
    (block,) = re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)
    return block


def test_the_documented_example_runs_and_balances_every_slot(tmp_path: Path) -> None:
    text = guide()
    pipelines = tmp_path / "pipelines"
    (pipelines / "controllers").mkdir(parents=True)
    (pipelines / "controllers" / "balance.py").write_text(code_block(text, "python"))
    (pipelines / "balance.yaml").write_text(code_block(text, "yaml"))
    spec = load_pipeline(pipelines / "balance.yaml", deep=True)
    evaluation = evaluate(spec, outputs_dir=tmp_path / "outputs", project_dir=tmp_path)
    assert evaluation.summary.scheduled == 4
    assert evaluation.summary.succeeded == 4


class Recorder:
    """Records what it is called with; answers ``[B]`` zeros (the form a one-dimensional action may take)."""

    calls: ClassVar[list[dict[str, npt.NDArray[Any]]]] = []

    def __call__(self, observation: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        Recorder.calls.append({name: array.copy() for name, array in observation.items()})
        rows = {array.shape[0] for array in observation.values()}
        assert len(rows) == 1
        return np.zeros(rows.pop(), dtype=np.float32)


def test_a_scripted_policy_gets_flat_feature_names_and_batched_arrays_of_the_contract_dtypes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Recorder, "calls", [])
    num_envs = 3
    text = (
        "name: recorded\n"
        f"sim: {{factory: '{CAMERA_PENDULUM}', num_envs: {num_envs}}}\n"
        f"agent: {{policy: {{kind: scripted, target: '{__name__}:Recorder'}}}}\n"
        "max_steps: 4\n"
    )
    spec = load_pipeline_text(text, source=tmp_path / "recorded.yaml")
    evaluation = evaluate(spec, outputs_dir=tmp_path / "outputs", project_dir=ROOT)
    assert evaluation.summary.errored == 0
    contract = load_contract(evaluation.outputs.contract)
    assert list(contract.observation_features) == ["pixels", "state"]
    assert contract.features["pixels"].is_camera
    assert Recorder.calls
    for observation in Recorder.calls:
        assert list(observation) == list(contract.observation_features)
        rows = observation["state"].shape[0]
        assert 1 <= rows <= num_envs
        for name, feature in contract.observation_features.items():
            assert observation[name].dtype == np.dtype(feature.dtype)
            assert observation[name].shape == (rows, *feature.shape)
    assert Recorder.calls[0]["pixels"].dtype == np.uint8
    assert Recorder.calls[0]["pixels"].shape[1:] == contract.features["pixels"].shape  # [B, H, W, C]
