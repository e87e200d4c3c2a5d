"""Provenance: every result says where it came from, and results of another environment are never merged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.errors import Fault
from hud_pipelines.eval import provenance
from hud_pipelines.eval.configuration import CurrentBy, judged_now
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.eval.rows import collect_rows
from hud_pipelines.eval.steps import evaluate
from tests.dagster.support import REPO
from tests.eval.test_eval_outputs import _spec


def test_every_result_records_its_provenance_and_the_report_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MUJOCO_GL", "egl")
    spec = _spec(tmp_path, group=2, dataset=None)
    evaluate(spec, outputs_dir=tmp_path / "out")
    base = tmp_path / "out" / "placed"
    contract = (base / "contract.json").read_text()
    for key in ("task0-i0", "task0-i1"):
        record = json.loads((base / "rollouts" / f"{key}.json").read_text())["provenance"]
        assert record["packages"]["gymnasium"] == __import__("gymnasium").__version__
        assert record["renderer"] == {"MUJOCO_GL": "egl"}
        assert record["sim_factory"] == "CartPole-v1"
        assert record["seeds"] == {"task0": 0}
        assert record["rollout_hash"] == spec.rollout_hash
        assert record["contract_hash"] == __import__("hashlib").sha256(contract.encode()).hexdigest()
        assert record["hud_pipelines_revision"], "the project's git revision"
    report = (base / "report.md").read_text()
    assert "## Provenance" in report
    assert "MUJOCO_GL=egl" in report


def test_the_provenance_names_each_tasks_own_build_arguments(tmp_path: Path) -> None:
    """A benchmark's tasks override ``sim.args`` (MetaWorld's task name): the report showed only sim.args."""
    from hud_pipelines.spec.loader import load_pipeline_text

    text = {
        "name": "tasks",
        "sim": {"factory": "CartPole-v1", "args": {"task": "reach"}},
        "agent": {"policy": {"kind": "random"}},
        "tasks": [{"name": "reach"}, {"name": "push", "args": {"task": "push"}}],
    }
    record = provenance.for_run(load_pipeline_text(json.dumps(text), source=tmp_path / "tasks.yaml"))
    assert record["task_args"] == {"push": {"task": "push"}}
    assert '- tasks\' own args over those: {"push": {"task": "push"}}' in provenance.markdown(record)


def test_the_provenance_in_report_md_shows_html_in_args_and_settings_as_text(tmp_path: Path) -> None:
    """Build arguments, a task's own and the policy's settings are the user's text: report.md wrote them raw, so a
    renderer ran the tag in ``note: <img onerror=...>``; a backtick in a value ended the policy's code span early."""
    from hud_pipelines.spec.loader import load_pipeline_text

    text = {
        "name": "tags",
        "sim": {"factory": "CartPole-v1", "args": {"note": "<img src=x onerror=alert(1)>"}},
        "agent": {"policy": {"kind": "scripted", "target": "envs/cartpole_pd.py:pd", "args": {"k": "`<b>x</b>`"}}},
        "tasks": [{"name": "reach"}, {"name": "push", "args": {"note": "<i>push</i>"}}],
    }
    shown = provenance.markdown(provenance.for_run(load_pipeline_text(json.dumps(text), source=tmp_path / "t.yaml")))
    for tag in ("<img", "<i>", "<b>"):
        assert tag not in shown.replace(f"`{tag}", ""), shown
    assert '{"note": "&lt;img src=x onerror=alert(1)>"}' in shown
    assert '{"push": {"note": "&lt;i>push&lt;/i>"}}' in shown


def test_results_of_another_environment_are_not_merged_into_one_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    spec = _spec(tmp_path, group=2, dataset=None)
    first = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.fault for row in first.rows} == {None}
    real = provenance.environment

    def upgraded(spec: Any, code: Any = None) -> dict[str, Any]:
        found = real(spec, code)
        return {**found, "packages": {**found["packages"], "mujoco": "9.9.9"}}

    monkeypatch.setattr(provenance, "environment", upgraded)
    second = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partitions()[0]])
    ran = [row for row in second.rows if row.instance == 0]
    stale = [row for row in second.rows if row.instance == 1]
    assert {row.fault for row in ran} == {None}
    assert {row.fault for row in stale} == {Fault.NOT_RUN}
    assert all("another environment (mujoco" in (row.error or "") and "-> 9.9.9" in (row.error or "") for row in stale)


def test_a_sim_under_its_own_interpreter_records_that_environments_versions() -> None:
    from hud_pipelines.spec.loader import load_pipeline

    spec = load_pipeline(REPO / "pipelines" / "metaworld_reach.yaml")
    if not (REPO / "sims" / "metaworld" / ".venv").is_dir():
        pytest.skip("sims/metaworld/.venv is not set up (scripts/setup does it)")
    found = provenance.environment(spec)
    assert found["sim_python"].endswith("sims/metaworld/.venv/bin/python")
    assert found["sim_packages"]["mujoco"] == "3.3.0", "the sim's own mujoco, not the agent's"
    assert found["packages"]["mujoco"] != "3.3.0"
    assert found["sim_packages"]["gymnasium"]


def test_a_run_claims_one_served_sim_that_its_steps_and_units_hold_to_and_a_later_run_claims_anew(
    tmp_path: Path,
) -> None:
    from hud_pipelines.eval.configuration import claim_served_sim, record_configuration, recorded_provenance
    from hud_pipelines.eval.outputs import EvalOutputs

    spec = _spec(tmp_path)
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    first = {"factory": "/a/envs/x.py:make", "factory_name": "x.py:make", "args": {"length": 40}, "packages": {}}
    other = {**first, "args": {"length": 5}}
    record_configuration(spec, spec, outputs, run_id="run-1")
    spawned = recorded_provenance(outputs)
    assert "served_sim" not in spawned, "nothing is claimed before a served sim is met"
    assert claim_served_sim(outputs, "run-1", first) == first
    assert claim_served_sim(outputs, "run-1", other) == first, "a unit of the same run is held to the first claim"
    claimed = recorded_provenance(outputs)
    assert (claimed["sim_args"], claimed["sim_factory"]) == ({"length": 40}, "/a/envs/x.py:make")
    assert claimed["fingerprint"] != spawned["fingerprint"]
    assert (
        provenance.fingerprint(provenance.with_served_sim(spawned, {**first, "python": "/elsewhere/python"}))
        == (claimed["fingerprint"])
    ), "the same sim served from another interpreter's path is the same sim"
    record_configuration(spec, spec, outputs, run_id="run-2")
    assert "served_sim" not in recorded_provenance(outputs), "run-1's claim is not run-2's"
    assert claim_served_sim(outputs, "run-2", other) == other
    assert recorded_provenance(outputs)["fingerprint"] not in {spawned["fingerprint"], claimed["fingerprint"]}


def test_only_the_latest_runs_records_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run wrote ``configurations/<run id>.json`` (with its contract note and served-sim claim) and none was
    ever removed: a pipeline run every few minutes filled its folder."""
    import hashlib
    import os

    from hud_pipelines.eval import configuration
    from hud_pipelines.eval.outputs import EvalOutputs

    monkeypatch.setattr(configuration, "RUN_RECORDS_KEPT", 2)
    spec = _spec(tmp_path)
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    served = {"factory": "/a/envs/x.py:make", "factory_name": "x.py:make", "args": {}, "packages": {}}
    for number in range(1, 5):
        configuration.record_configuration(spec, spec, outputs, run_id=f"run-{number}")
        configuration.write_contract(outputs, f"run-{number}", "{}")
        configuration.claim_served_sim(outputs, f"run-{number}", served)
        for folder in (outputs.configurations, outputs.served_sims):  # written a second apart, as runs are
            for path in folder.glob(f"run-{number}.*"):
                os.utime(path, ns=(number * 10**9, number * 10**9))
    names = sorted(p.name for p in outputs.configurations.iterdir())
    assert names == ["run-3.contract", "run-3.json", "run-4.contract", "run-4.json"]
    assert sorted(p.name for p in outputs.served_sims.iterdir()) == ["run-3.json", "run-4.json"]
    assert configuration.read_served_sim(outputs, "run-4") == served, "the latest run's own records are whole"
    assert configuration.recorded_provenance(outputs, "run-4")["contract_hash"] == hashlib.sha256(b"{}").hexdigest()


CONTROLLER = """
import numpy as np

from gains import GAIN


class PD:
    def __call__(self, observation):
        state = np.asarray(observation["state"], dtype=np.float64).reshape(-1, 4)
        return (GAIN * state[:, 2] + state[:, 3] > 0).astype(np.float32)[:, None]
"""


def _scripted(tmp_path: Path, helper: str = "gains", **fields: Any) -> Any:
    """A pipeline whose scripted policy is ``controller.py`` in ``tmp_path``, importing ``<helper>.py`` beside it
    (a name of its own per test: a process imports one module of a name)."""
    (tmp_path / "controller.py").write_text(CONTROLLER.replace("from gains", f"from {helper}"))
    (tmp_path / f"{helper}.py").write_text("GAIN = 10.0\n")
    return _spec(tmp_path, dataset=None, agent={"policy": {"kind": "scripted", "target": "controller.py:PD"}}, **fields)


def test_an_edit_of_the_code_a_target_names_makes_earlier_results_another_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    spec = _scripted(tmp_path, group=2)
    recorded = provenance.environment(spec)["sources"]
    assert {Path(path).name for path in recorded} == {"controller.py", "gains.py"}, "the file and its imports beside it"
    first = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.fault for row in first.rows} == {None}

    (tmp_path / "gains.py").write_text("GAIN = 1.0\n")  # a helper beside the target, edited
    second = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partitions()[0]])
    stale = [row for row in second.rows if row.instance == 1]
    assert {row.fault for row in stale} == {Fault.NOT_RUN}, "results of the old code are not merged with the new"
    assert all("code or weights changed: gains.py" in (row.error or "") for row in stale)
    assert {row.fault for row in second.rows if row.instance == 0} == {None}


def test_hud_pipelines_report_sees_an_edit_of_the_code_since_the_last_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``report`` judges the results by the code as it is now, as the next run would (nothing runs)."""
    from hud_pipelines.cli.main import main

    monkeypatch.chdir(REPO)
    spec = _scripted(tmp_path, helper="report_gains")
    (tmp_path / "placed.yaml").write_text(json.dumps(spec.model_dump(mode="json")))
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    report = ["report", str(tmp_path / "placed.yaml"), "--outputs", str(tmp_path / "out")]
    assert main(report) == 0
    grades = json.loads(evaluation.outputs.grades_json.read_text())
    assert {row["fault"] for row in grades} == {None}, "the same code: current"
    (tmp_path / "report_gains.py").write_text("GAIN = 1.0\n")
    assert main(report) == 1, "nothing current is answered: a blocking check fails, as in a run"
    grades = json.loads(evaluation.outputs.grades_json.read_text())
    assert {row["fault"] for row in grades} == {"not_run"}
    assert all("code or weights changed: report_gains.py" in row["error"] for row in grades)
    assert "errored 2" in evaluation.outputs.report_md.read_text(), "the report says what the grades say"


def test_report_judges_the_code_a_run_with_a_deployment_file_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployment file names another policy file: the results are that file's, and ``report`` digests it as
    the run did (it digested the YAML's file and called every result another environment's)."""
    from hud_pipelines.cli.main import main

    monkeypatch.chdir(REPO)
    spec = _scripted(tmp_path, helper="deployed_gains")
    (tmp_path / "other.py").write_text((tmp_path / "controller.py").read_text() + "\n# another file\n")
    (tmp_path / "placed.yaml").write_text(json.dumps(spec.model_dump(mode="json") | {"name": "placed"}))
    other = {"policy": {"kind": "scripted", "target": f"{tmp_path / 'other.py'}:PD"}}
    (tmp_path / "deploy.yaml").write_text(json.dumps({"pipelines": {"placed": {"agent": other}}}))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(tmp_path / "deploy.yaml"))
    outputs = ["--outputs", str(tmp_path / "out")]
    assert main(["run", str(tmp_path / "placed.yaml"), "--quiet", *outputs]) == 0
    assert main(["report", str(tmp_path / "placed.yaml"), *outputs]) == 0
    grades = json.loads((tmp_path / "out" / "placed" / "grades.json").read_text())
    assert {row["fault"] for row in grades} == {None}, [row["error"] for row in grades]


def test_a_targets_files_are_found_without_importing_them(tmp_path: Path) -> None:
    from hud_pipelines.targets import target_sources

    package = tmp_path / "mine"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    (package / "envs.py").write_text("import helpers\nimport os\nfrom mine import other\n")
    (package / "helpers.py").write_text("")
    (tmp_path / "plain.py").write_text("import numpy\n")
    assert target_sources("mine.envs:Make", tmp_path) == [
        package / "envs.py",
        package / "__init__.py",  # importing mine.envs runs it (and ``other`` is no module: not followed)
        package / "helpers.py",
    ]
    assert target_sources("plain.py:make", tmp_path) == [tmp_path / "plain.py"]


def test_a_targets_sources_follow_its_helpers_own_imports_and_relative_ones(tmp_path: Path) -> None:
    """An edit of any file the target's code runs must show: a helper's helper, a module of the package."""
    from hud_pipelines.targets import target_sources

    (tmp_path / "senv.py").write_text("from helper import SUCC_MOD\n")
    (tmp_path / "helper.py").write_text("from helper2 import M\nSUCC_MOD = M\n")
    (tmp_path / "helper2.py").write_text("import numpy\nM = 2\n")
    package = tmp_path / "stalepkg"
    (package / "parts").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "env.py").write_text("from .cfg import MOD\nfrom . import parts\n")
    (package / "cfg.py").write_text("from .parts.gains import GAIN\nMOD = 2\n")
    (package / "parts" / "__init__.py").write_text("")
    (package / "parts" / "gains.py").write_text("from ..cfg import MOD\nGAIN = 1\n")  # a cycle ends
    assert target_sources("senv.py:make", tmp_path) == [tmp_path / f for f in ("senv.py", "helper.py", "helper2.py")]
    assert target_sources("stalepkg.env:make", tmp_path) == [
        package / "env.py",
        package / "__init__.py",
        package / "cfg.py",
        package / "parts" / "__init__.py",
        package / "parts" / "gains.py",
    ]
    assert target_sources("CartPole-v1", tmp_path) == []
    assert target_sources("gym_pusht/PushT-v0", tmp_path) == [], "an installed namespace: its version is recorded"
    assert target_sources("json/Decoder-v0", tmp_path) == [], "the standard library is no code of the project"
    namespace = tmp_path / "hudns_envs"  # the project's own package registers the id: its code is the env's
    (namespace / "dynamics").mkdir(parents=True)
    (namespace / "__init__.py").write_text(
        "import gymnasium as gym\nfrom hudns_envs.dynamics.paced import Paced\n"
        "gym.register(id='hudns_envs/Paced-v0', entry_point=Paced)\n"
    )
    (namespace / "dynamics" / "__init__.py").write_text("")
    (namespace / "dynamics" / "paced.py").write_text("NOISE = 0.05\nclass Paced: ...\n")
    assert target_sources("hudns_envs/Paced-v0", tmp_path) == [
        namespace / "__init__.py",
        namespace / "dynamics" / "__init__.py",
        namespace / "dynamics" / "paced.py",
    ], "an edit of the env's noise made no earlier result stale"
    assert target_sources("nowhere.to.be:found", tmp_path) == []
    # a policy built on this package's own classes, in a checkout of it: the package is no code of the project
    assert target_sources("envs.aloha_experts:InsertionExpert", REPO) == [
        REPO / "envs" / "aloha_experts.py",
        REPO / "envs" / "__init__.py",
    ]


def test_a_single_policys_weights_are_part_of_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hud_pipelines.eval.sources import digests

    (tmp_path / "net.py").write_text("class Net: ...\n")
    (tmp_path / "weights.pt").write_bytes(b"first")
    policy = {"kind": "torch", "target": "net.py:Net", "checkpoint": "weights.pt"}
    spec = _spec(tmp_path, agent={"policy": policy})
    before = digests(spec)
    assert {Path(path).name for path in before} == {"net.py", "weights.pt"}
    (tmp_path / "weights.pt").write_bytes(b"second, retrained")
    after = digests(spec)
    real = Path.read_bytes

    def denied(file: Path) -> bytes:  # root reads any file: the refusal is staged
        if file.name == "net.py":
            raise PermissionError(13, "Permission denied", str(file))
        return real(file)

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert digests(spec)["net.py"] == "unreadable", "the policy's load says why; provenance does not raise"
    assert after["weights.pt"] != before["weights.pt"]
    assert after["net.py"] == before["net.py"]


EDITING_CONTROLLER = CONTROLLER.replace("from gains import", "from edited_gains import").replace(
    "    def __call__(self, observation):\n",
    "    def __call__(self, observation):\n"
    "        import pathlib\n"
    "        here = pathlib.Path(__file__).with_name('edited_gains.py')\n"
    "        if '10.0' in here.read_text():\n"
    "            here.write_text('GAIN = 1.0\\n')  # the user edits the helper while the run goes on\n",
)


def test_results_carry_the_code_the_run_loaded_and_a_moved_project_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.eval.rows import collect_rows

    monkeypatch.chdir(REPO)
    project = tmp_path / "a"
    project.mkdir()
    (project / "controller.py").write_text(EDITING_CONTROLLER)
    (project / "edited_gains.py").write_text("GAIN = 10.0\n")
    policy = {"kind": "scripted", "target": "controller.py:PD"}
    spec = _spec(project, group=2, dataset=None, agent={"policy": policy})
    assert set(provenance.environment(spec)["sources"]) == {"controller.py", "edited_gains.py"}, "relative paths"
    first = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.fault for row in first.rows} == {None}, "the run's own results: the code it loaded, GAIN = 10"
    (project / "edited_gains.py").write_text("GAIN = 10.0\n")  # as it was when the results were made

    shutil.copytree(project, tmp_path / "b")  # the same project elsewhere: the same sources
    moved = _spec(tmp_path / "b", group=2, dataset=None, agent={"policy": policy})
    outputs = EvalOutputs(tmp_path / "out", moved.name)
    rows = collect_rows(moved, outputs, current=CurrentBy(environment=provenance.for_run(moved)))
    assert {row.fault for row in rows} == {None}, "a moved project keeps its results"
    (project / "edited_gains.py").write_text("GAIN = 1.0\n")
    rows = collect_rows(spec, outputs, current=CurrentBy(environment=provenance.for_run(spec)))
    assert {row.fault for row in rows} == {Fault.NOT_RUN}, "results of GAIN = 10 are not GAIN = 1's"


def test_results_recorded_before_sources_are_judged_on_the_rest_of_the_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "controller.py").write_text(CONTROLLER)
    (tmp_path / "gains.py").write_text("GAIN = 10.0\n")
    spec = _spec(tmp_path, agent={"policy": {"kind": "scripted", "target": "controller.py:PD"}})
    current = provenance.for_run(spec)
    older = {key: value for key, value in current.items() if key != "sources"}
    older["fingerprint"] = provenance.fingerprint(older)
    assert not provenance.other_environment(older, current), "an upgrade alone does not make every result stale"
    edited = {**current, "sources": {**current["sources"], "gains.py": "0" * 16}}
    edited["fingerprint"] = provenance.fingerprint(edited)
    assert provenance.other_environment(edited, current)


def test_a_served_sims_code_is_part_of_the_fingerprint_once_its_server_sends_it(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    served = {"factory_name": "reach.py:make", "args": {}, "packages": {"numpy": "2.0"}, "sources": {"reach.py": "a"}}
    current = provenance.for_run(spec, served_sim=served)
    edited = provenance.for_run(spec, served_sim={**served, "sources": {"reach.py": "b"}})
    assert provenance.other_environment(edited, current)
    assert "the served sim's code changed: reach.py" in provenance.difference(edited, current)
    earlier_server = provenance.for_run(spec, served_sim={k: v for k, v in served.items() if k != "sources"})
    assert not provenance.other_environment(earlier_server, current), "a server that sent no digests: the rest"
    assert provenance.other_environment(
        earlier_server, provenance.for_run(spec, served_sim={**served, "args": {"x": 1}})
    )


def test_a_contract_derived_after_the_configuration_was_recorded_is_in_the_provenance(tmp_path: Path) -> None:
    """A first run on Celery workers records its configuration before any unit derived the contract: its report said
    the contract's hash was unknown, where the same run in process named it."""
    from hud_pipelines.eval.configuration import record_configuration, recorded_provenance
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.spec.loader import load_pipeline_text

    text = {"name": "later", "sim": {"factory": "CartPole-v1"}, "agent": {"policy": {"kind": "random"}}}
    spec = load_pipeline_text(json.dumps(text), source=tmp_path / "later.yaml")
    outputs = EvalOutputs(tmp_path / "outputs", "later")
    record_configuration(spec, spec, outputs, run_id="first")
    assert recorded_provenance(outputs)["contract_hash"] is None
    outputs.contract.write_text('{"derived": "by a unit"}\n')
    expected = __import__("hashlib").sha256(b'{"derived": "by a unit"}\n').hexdigest()
    assert recorded_provenance(outputs)["contract_hash"] == expected


def test_an_edit_of_the_contract_file_makes_earlier_results_another_environments(tmp_path: Path) -> None:
    """The contract file is the user's to edit (names, bounds, rates): results run under the contract before an edit
    were counted current beside those after it, and one dataset mixed actions clipped to two bounds."""
    from hud_pipelines.spec.loader import load_pipeline_text

    text = {
        "name": "bounded",
        "sim": {"factory": "Pendulum-v1", "contract": "bounded.json"},
        "agent": {"policy": {"kind": "constant", "value": [1.5]}},
        "group": 2,
        "max_steps": 5,
        "graders": [{"kind": "return"}],
    }
    spec = load_pipeline_text(json.dumps(text), source=tmp_path / "bounded.yaml")
    first = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.fault for row in first.rows} == {None}
    again = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partitions()[0]])
    assert {row.fault for row in again.rows} == {None}, "the same contract: the other instance's result is current"

    contract = json.loads((tmp_path / "bounded.json").read_text())
    reordered = {**contract, "features": dict(reversed(contract["features"].items()))}  # the env's order wins
    (tmp_path / "bounded.json").write_text(json.dumps(reordered, indent=4))  # only its formatting and order
    outputs = EvalOutputs(tmp_path / "out", spec.name)
    assert {row.fault for row in collect_rows(spec, outputs, current=judged_now(spec, outputs))} == {None}
    contract["features"]["action"]["high"] = [1.0]  # the action is clipped to 1 from now on
    (tmp_path / "bounded.json").write_text(json.dumps(contract))
    now = collect_rows(spec, outputs, current=judged_now(spec, outputs))  # as `hud-pipelines report` judges them
    assert {row.fault for row in now} == {Fault.NOT_RUN}, "stale at once, before the next run: as after a code edit"
    assert all("the contract changed" in (row.error or "") for row in now)
    edited = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partitions()[0]])
    stale = [row for row in edited.rows if row.instance == 1]
    assert {row.fault for row in stale} == {Fault.NOT_RUN}, "a result of the contract before the edit is not current"
    assert all("the contract changed" in (row.error or "") for row in stale)
    assert {row.fault for row in edited.rows if row.instance == 0} == {None}


REWRITES_CONTRACT = """
import json
from pathlib import Path

import numpy as np


def rewriting(contract):
    '''A constant policy, built as the run's rollouts begin, while another run of the pipeline with other sim
    arguments writes its own contract over contract.json.'''
    other = json.loads(Path(contract).read_text())
    other["control_rate"] = other["control_rate"] * 2
    Path(contract).write_text(json.dumps(other))
    return lambda observation: np.full((len(observation["state"]), 1), 0.5, np.float32)
"""


def test_a_runs_results_stay_current_when_an_overlapping_run_rewrites_the_contract_file(tmp_path: Path) -> None:
    from hud_pipelines.spec.loader import load_pipeline_text

    (tmp_path / "rewriting.py").write_text(REWRITES_CONTRACT)
    contract = tmp_path / "out" / "overlapped" / "contract.json"
    text = {
        "name": "overlapped",
        "sim": {"factory": "Pendulum-v1"},
        "agent": {
            "policy": {"kind": "scripted", "target": "rewriting.py:rewriting", "args": {"contract": str(contract)}}
        },
        "group": 2,
        "max_steps": 5,
        "graders": [{"kind": "return"}],
    }
    spec = load_pipeline_text(json.dumps(text), source=tmp_path / "overlapped.yaml")
    evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    assert {row.fault for row in evaluation.rows} == {None}, "judged by the contract this run derived"
    result = json.loads((contract.parent / "rollouts" / "task0-i0.json").read_text())
    written = __import__("hashlib").sha256(contract.read_text().encode()).hexdigest()
    assert result["provenance"]["contract_hash"] != written, "the other run's contract.json stands over this run's"


SCENE_SIM = """
import json
from pathlib import Path

import gymnasium as gym
import numpy as np


class Reach(gym.Env):
    def __init__(self):
        self.target = json.loads((Path(__file__).parent / "scene.json").read_text())["target"]
        self.observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = 0.0
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += float(action[0])
        return np.array([self.x], np.float32), -abs(self.x - self.target), False, False, {}
"""


def test_an_edit_of_a_data_file_the_sim_reads_makes_earlier_results_stale_once_data_files_lists_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sim that reads ``scene.json`` beside it: an edit of the scene kept the earlier results current (its imports
    name no such file), and a run of one instance pooled two scenes into one rate. Listed in ``sim.data_files``,
    its content is in the fingerprint: the earlier results are not run, at once (``report``) and after a run."""
    from hud_pipelines.spec.loader import load_pipeline_text

    monkeypatch.chdir(REPO)
    (tmp_path / "scene_sim.py").write_text(SCENE_SIM)
    (tmp_path / "scene.json").write_text('{"target": 1.0}')

    def spec_with(**sim: Any) -> Any:
        text = {
            "name": "scene",
            "sim": {"factory": "scene_sim.py:Reach", **sim},
            "agent": {"policy": {"kind": "constant", "value": [0.5]}},
            "group": 2,
            "max_steps": 4,
            "graders": [{"kind": "return", "threshold": -2}],
        }
        return load_pipeline_text(json.dumps(text), source=tmp_path / "scene.yaml")

    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "arm.xml").write_text("<arm/>")
    spec = spec_with(data_files=["**/*.json", "assets"])  # the outputs below the pipeline's folder match the glob
    assert spec.rollout_hash == spec_with().rollout_hash, "listing a file changes what is tracked, not a rollout"
    assert "scene.json" not in provenance.environment(spec_with())["sources"], "no import names it"
    assert "scene.json" in provenance.environment(spec)["sources"]
    outputs = EvalOutputs(tmp_path / "out", "scene")
    evaluate(spec, outputs_dir=outputs.root)
    again = evaluate(spec, outputs_dir=outputs.root, partitions=[spec.partitions()[0]])
    assert {row.fault for row in again.rows} == {None}, "the run's own outputs are never its sim's data"

    (tmp_path / "assets" / "hand.xml").write_text("<hand/>")  # a file added to a listed folder: seen by `report`
    now = collect_rows(spec, outputs, current=judged_now(spec, outputs))
    assert {row.fault for row in now} == {Fault.NOT_RUN}
    assert all("code or weights changed: newly tracked hand.xml" in (row.error or "") for row in now), now[0].error
    (tmp_path / "assets" / "hand.xml").unlink()
    assert {row.fault for row in collect_rows(spec, outputs, current=judged_now(spec, outputs))} == {None}

    (tmp_path / "scene.json").write_text('{"target": 1.5}')
    now = collect_rows(spec, outputs, current=judged_now(spec, outputs))  # as `hud-pipelines report` judges them
    assert {row.fault for row in now} == {Fault.NOT_RUN}, "stale at once, as after an edit of the code"
    second = evaluate(spec, outputs_dir=outputs.root, partitions=[spec.partitions()[0]])
    stale = [row for row in second.rows if row.instance == 1]
    assert {row.fault for row in stale} == {Fault.NOT_RUN}, "results of the old scene are not pooled with the new"
    assert all("code or weights changed: scene.json" in (row.error or "") for row in stale), stale[0].error
    assert {row.fault for row in second.rows if row.instance == 0} == {None}


def test_a_stale_results_reason_names_a_few_edited_files_and_says_which_are_newly_tracked() -> None:
    """Listing a folder of meshes in ``sim.data_files`` named hundreds of files as "changed" in every stale row."""
    was = {"env.py": "1", **{f"meshes/m{i}.stl": "a" for i in range(3)}}
    now = {"env.py": "2", **{f"meshes/m{i}.stl": "a" for i in range(3)}, **{f"new/n{i}.stl": "b" for i in range(8)}}
    said = provenance.difference({"sources": was}, {"sources": now})
    assert said == "code or weights changed: env.py, newly tracked n0.stl, n1.stl, n2.stl, n3.stl, n4.stl and 3 more"
    deleted = now | {"meshes/m1.stl": provenance.UNREADABLE}  # a data file deleted since is said so, not "changed"
    said = provenance.difference({"sources": was}, {"sources": deleted})
    assert said.startswith("code or weights changed: env.py, unreadable now m1.stl, newly tracked n0.stl"), said
