"""Each pipeline's sim, contract, agent and graders are Dagster resources: listed, overridden per run,
swapped per deployment, and never mixed into results of another configuration."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from hud_pipelines.dagster.definitions import build_definitions, definitions_for_file
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.outputs import EvalOutputs
from hud_pipelines.recording.events import EpisodeStatus
from tests.dagster.support import REPO, WritePipeline, sim_processes

PARTS = ("sim", "contract", "agent", "graders")


def _grades(outputs: Path, name: str) -> list[GradeRow]:
    return [GradeRow.from_dict(r) for r in json.loads(EvalOutputs(outputs, name).grades_json.read_text())]


def _run(path: Path, outputs: Path, instance: dg.DagsterInstance, **kwargs: Any) -> dg.ExecuteInProcessResult:
    defs = definitions_for_file(path, outputs_dir=outputs, project_dir=REPO, **kwargs.pop("defs", {}))
    name = json.loads(path.read_text())["name"]
    return defs.resolve_job_def(name).execute_in_process(instance=instance, raise_on_error=False, **kwargs)


def test_every_bundled_pipeline_has_its_four_resources_with_their_config() -> None:
    defs = build_definitions(REPO / "pipelines")
    resources = defs.resources or {}
    from hud_pipelines.spec.loader import load_pipelines

    for spec in load_pipelines(REPO / "pipelines"):
        for part in PARTS:
            resource = resources[f"{spec.name}__{part}"]
            assert isinstance(resource, dg.ConfigurableResource)
            assert type(resource).__doc__, "described for the UI"
        sim = resources[f"{spec.name}__sim"]
        assert getattr(sim, "num_envs") == spec.sim.num_envs  # noqa: B009 - the YAML's value is the default
        agent = resources[f"{spec.name}__agent"]
        assert getattr(agent, "policy")["kind"] == spec.agent.policy.kind  # noqa: B009
        fields = type(sim).model_fields
        assert {"factory", "num_envs", "url", "token", "step_timeout_s"} <= set(fields)
    job = defs.resolve_job_def("cartpole_pd")
    assert {f"cartpole_pd__{part}" for part in PARTS} <= set(job.resource_defs)


def test_a_run_config_override_is_used_recorded_and_keeps_results_apart(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    import torch

    from envs.policies import CartPoleTorchPD

    module = CartPoleTorchPD()
    with torch.no_grad():
        module.gains.copy_(torch.tensor([0.1, 0.5, 10.0, 2.0]))
    torch.save(module.state_dict(), tmp_path / "balanced.pt")
    torch.save(CartPoleTorchPD().state_dict(), tmp_path / "untrained.pt")
    policy = {"kind": "torch", "target": "envs.policies:CartPoleTorchPD", "checkpoint": str(tmp_path / "balanced.pt")}
    path = write_pipeline("overridden", agent={"policy": policy}, group=1, max_steps=60)
    assert _run(path, outputs_dir, instance).success
    assert [r.status for r in _grades(outputs_dir, "overridden")] == [EpisodeStatus.SUCCEEDED] * 2

    untrained = {**policy, "checkpoint": str(tmp_path / "untrained.pt")}
    run_config = {
        "resources": {
            "overridden__sim": {"config": {"num_envs": 3}},
            "overridden__agent": {"config": {"policy": untrained}},
        }
    }
    result = _run(path, outputs_dir, instance, run_config=run_config)
    assert result.success
    rows = _grades(outputs_dir, "overridden")
    assert len(rows) == 3, "three slots: the override of num_envs was used"
    assert {r.status for r in rows} == {EpisodeStatus.FAILED}, "zero gains cannot balance: the checkpoint was used"
    assert {r.run_id for r in rows} == {result.run_id}
    recorded = json.loads(EvalOutputs(outputs_dir, "overridden").configuration_json.read_text())
    assert recorded["overrides"] == {"sim.num_envs": 3, "agent.policy.checkpoint": str(tmp_path / "untrained.pt")}
    report = EvalOutputs(outputs_dir, "overridden").report_md.read_text()
    assert "`sim.num_envs` = `3`" in report

    # the YAML's configuration again: the override's results are stale until it runs again
    from hud_pipelines.eval.configuration import CurrentBy, RolloutHashes
    from hud_pipelines.eval.rows import collect_rows
    from hud_pipelines.spec.loader import load_pipeline

    spec = load_pipeline(path)
    stale = collect_rows(spec, EvalOutputs(outputs_dir, "overridden"), current=CurrentBy(RolloutHashes.of(spec)))
    assert {r.fault.value if r.fault else None for r in stale} == {"not_run"}


def test_instances_a_run_with_more_slots_did_not_run_are_scheduled_as_it_runs_them(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance
) -> None:
    """One instance run with ``num_envs: 3`` in the run config: the other instance's not-run rows came from
    the YAML's 2 slots, so the table said 5 scheduled where the configuration it grades schedules 6."""
    path = write_pipeline("widened", group=2)
    assert _run(path, outputs_dir, instance).success
    one = {"dagster/asset_partition_range_start": "task0-i1", "dagster/asset_partition_range_end": "task0-i1"}
    run_config = {"resources": {"widened__sim": {"config": {"num_envs": 3}}}}
    assert _run(path, outputs_dir, instance, run_config=run_config, tags=one).success
    rows = _grades(outputs_dir, "widened")
    assert [(r.instance, r.slot, r.seed) for r in rows] == [(i, s, i * 3 + s) for i in (0, 1) for s in range(3)]
    assert [r.fault.value if r.fault else None for r in rows if r.instance == 0] == ["not_run"] * 3
    assert "Scheduled 6 = succeeded 3" in EvalOutputs(outputs_dir, "widened").report_md.read_text()


def test_an_invalid_override_is_refused_naming_the_key_before_any_sim_starts(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, label: str
) -> None:
    path = write_pipeline("refused")
    result = _run(path, outputs_dir, instance, run_config={"resources": {"refused__sim": {"config": {"num_envs": 0}}}})
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = " ".join(
        (e.step_failure_data.error.cause or e.step_failure_data.error).message
        for e in failures
        if e.step_failure_data.error
    )
    assert "the run's configuration is invalid: sim.num_envs: expected a number >= 1, got 0" in message, (
        "as a file says"
    )
    assert not sim_processes(label)
    assert not EvalOutputs(outputs_dir, "refused").result("task0-i0").exists()


def test_lockstep_threads_overridden_in_a_run_config_is_a_number_or_auto_checked_as_the_yaml_checks_it(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A number there was refused by Dagster ("expected String"): the field took only text."""
    path = write_pipeline("threaded", group=1, max_steps=5)
    config = {"resources": {"threaded__agent": {"config": {"lockstep_threads": "aut"}}}}
    refused = _run(path, outputs_dir, instance, run_config=config)
    assert not refused.success
    said = " ".join(
        (e.step_failure_data.error.cause or e.step_failure_data.error).message
        for e in refused.all_events
        if e.event_type_value == "STEP_FAILURE" and e.step_failure_data.error
    )
    assert "the run's configuration is invalid: agent.lockstep_threads: expected an integer, got 'aut'" in said
    assert "expected one of: auto, got 'aut' (did you mean 'auto'?)" in said
    config = {"resources": {"threaded__agent": {"config": {"lockstep_threads": 2}}}}
    assert _run(path, outputs_dir, instance, run_config=config).success
    recorded = json.loads(EvalOutputs(outputs_dir, "threaded").configuration_json.read_text())
    assert recorded["overrides"] == {"agent.lockstep_threads": 2}
    monkeypatch.setenv("THREADED_LOCKSTEP", "3")  # Dagster reads {env: NAME} only for text and number fields
    config = {"resources": {"threaded__agent": {"config": {"lockstep_threads": {"env": "THREADED_LOCKSTEP"}}}}}
    assert _run(path, outputs_dir, instance, run_config=config).success
    recorded = json.loads(EvalOutputs(outputs_dir, "threaded").configuration_json.read_text())
    assert recorded["overrides"] == {"agent.lockstep_threads": 3}, "read from the environment"
    monkeypatch.delenv("THREADED_LOCKSTEP")
    unset = _run(path, outputs_dir, instance, run_config=config)
    assert not unset.success
    assert any(
        "agent.lockstep_threads: environment variable THREADED_LOCKSTEP is not set"
        in (e.step_failure_data.error.cause or e.step_failure_data.error).message
        for e in unset.all_events
        if e.event_type_value == "STEP_FAILURE" and e.step_failure_data.error
    )


def test_an_override_whose_policy_target_does_not_exist_is_refused_before_any_sim_starts(
    write_pipeline: WritePipeline, outputs_dir: Path, instance: dg.DagsterInstance, label: str
) -> None:
    """The same typo in the YAML was refused at its line; in a run config, the run went on and every episode
    errored as ``setup`` ("has no attribute 'Nope'")."""
    path = write_pipeline("retargeted")
    policy = {"kind": "scripted", "target": "envs.controllers:Nope"}
    config = {"resources": {"retargeted__agent": {"config": {"policy": policy}}}}
    result = _run(path, outputs_dir, instance, run_config=config)
    assert not result.success
    said = " ".join(
        e.step_failure_data.error.to_string()
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE" and e.step_failure_data.error
    )
    assert (
        "the run's configuration (run config or deployment file): agent.policy.target: envs.controllers has no "
        "attribute 'Nope'"
    ) in said, said
    assert not sim_processes(label)
    assert not EvalOutputs(outputs_dir, "retargeted").result("task0-i0").exists()


def test_a_deployment_swaps_the_sim_for_a_served_one_without_touching_the_yaml(
    write_pipeline: WritePipeline,
    outputs_dir: Path,
    instance: dg.DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    label: str,
) -> None:
    from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV
    from hud_pipelines.sim.process import SimProcess

    path = write_pipeline("swapped", group=2, max_concurrent=1)
    yaml_before = path.read_text()
    with SimProcess.spawn("CartPole-v1", num_envs=2, build_args={"vectorization_mode": "sync"}) as served:
        monkeypatch.setenv("SWAPPED_SIM_TOKEN", served.token)
        deployment = tmp_path / "deployment.yaml"
        deployment.write_text(
            "pipelines:\n"
            "  swapped:\n"
            "    sim:\n"
            "      factory: null\n"
            "      args: {}\n"
            f"      url: {served.url}\n"
            "      token: {env: SWAPPED_SIM_TOKEN}\n"
        )
        monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
        result = _run(path, outputs_dir, instance)
        assert result.success
        assert not sim_processes(label), "no sim was spawned: the served one ran every instance"
        assert served.alive()
    rows = _grades(outputs_dir, "swapped")
    assert [(r.instance, r.status) for r in rows] == [(i, EpisodeStatus.SUCCEEDED) for i in (0, 0, 1, 1)]
    assert path.read_text() == yaml_before
    overrides = json.loads(EvalOutputs(outputs_dir, "swapped").configuration_json.read_text())["overrides"]
    assert "sim.token" not in overrides, "a credential is never recorded"
    assert overrides["sim.url"] == served.url


def test_a_bad_deployment_file_is_refused_naming_the_file_and_key(tmp_path: Path) -> None:
    from hud_pipelines.dagster.deployment import DeploymentError, for_pipeline, load_deployment

    with pytest.raises(DeploymentError, match=r"missing.yaml"):
        load_deployment(tmp_path / "missing.yaml")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("pipelines:\n  cartpole_pd:\n    simulator: {url: ws://x:1}\n")
    with pytest.raises(DeploymentError, match=r"pipelines\.cartpole_pd\.simulator: not a resource"):
        load_deployment(wrong)
    shared = tmp_path / "shared.yaml"
    shared.write_text('pipelines:\n  "*": {agent: {torch_threads: 2}}\n  a: {sim: {token: {env: TOKEN}}}\n')
    fields = for_pipeline(load_deployment(shared), "a")
    assert fields["agent"] == {"torch_threads": 2}
    assert isinstance(fields["sim"]["token"], dg.EnvVar)
    assert for_pipeline(load_deployment(shared), "b") == {"agent": {"torch_threads": 2}}

    numbered = tmp_path / "numbered.yaml"
    numbered.write_text("pipelines:\n  a: {agent: {lockstep_threads: 2}, sim: {python: null}}\n")
    assert for_pipeline(load_deployment(numbered), "a") == {"sim": {"python": None}, "agent": {"lockstep_threads": 2}}
    numbered.write_text("pipelines:\n  a: {agent: {lockstep_threads: true}}\n")  # held to the pipeline's own field
    with pytest.raises(
        DeploymentError, match=rf"{numbered}:2:\d+: pipelines\.a\.agent\.lockstep_threads: expected a number, got true"
    ):
        load_deployment(numbered)
    numbered.write_text("pipelines:\n  a: {agent: {lockstep_threads: {env: THREADS}}}\n")
    assert isinstance(for_pipeline(load_deployment(numbered), "a")["agent"]["lockstep_threads"], dg.EnvVar)
    typo = tmp_path / "typo.yaml"
    typo.write_text("pipelines:\n  a:\n    sim: {factroy: null, url: 'ws://x:1'}\n")
    with pytest.raises(DeploymentError) as refused:
        load_deployment(typo)
    assert str(refused.value).startswith(f"deployment file {typo}:3:11: pipelines.a.sim.factroy: not a field of")
    assert "(did you mean 'factory'?)" in str(refused.value)
    typed = tmp_path / "typed.yaml"
    typed.write_text("pipelines:\n  a:\n    sim:\n      num_envs: many\n")
    with pytest.raises(DeploymentError, match=r"typed.yaml:4:7: pipelines\.a\.sim\.num_envs: .*integer, got 'many'"):
        load_deployment(typed)


def test_a_deployment_field_that_breaks_a_pipelines_rule_is_named_at_its_line_before_any_run(
    tmp_path: Path,
    write_pipeline: WritePipeline,
    pipelines_dir: Path,
    outputs_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    label: str,
) -> None:
    """Each field had the right type (a number, a text), so the file was read as valid, ``validate`` said ok,
    and a run failed its first step saying ``agent.forward_timeout_s: Input should be greater than 0`` with no
    line of the file that set it."""
    from hud_pipelines.cli.main import main
    from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV

    path = write_pipeline("remote_eval")
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(
        "pipelines:\n"
        '  "*":\n'
        "    agent: {send_ahead: -2}\n"
        "  remote_eval:\n"
        "    sim: {url: 'ws://127.0.0.1:9', token: {env: UNSET_TOKEN}, hold: lats}\n"
        "    agent: {forward_timeout_s: -1}\n"
    )
    for key, value in {"HUD_PIPELINES_DIR": pipelines_dir, "HUD_PIPELINES_OUTPUTS": outputs_dir}.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    expected = (  # every one at once, each at its line, in a pipeline file's words
        ":3:13: pipelines.*.agent.send_ahead: expected a number >= 0, got -2",
        ":5:63: pipelines.remote_eval.sim.hold: expected one of: last, zero, got 'lats' (did you mean 'last'?)",
        ":6:13: pipelines.remote_eval.agent.forward_timeout_s: expected a number > 0, got -1",
    )
    assert main(["validate", "--no-deep", str(deployment)]) == 1
    said = capsys.readouterr().out
    for problem in expected:
        assert f"deployment file {deployment}{problem}" in said, said
    write_pipeline("other_eval")
    monkeypatch.setenv(DEPLOYMENT_ENV, str(deployment))
    assert main(["validate", "--no-deep"]) == 1
    assert capsys.readouterr().out.count("send_ahead") == 1, "a field set for every pipeline is named once"
    assert main(["run", str(path), "--quiet"]) == 2, "refused before the run"
    err = capsys.readouterr().err
    for problem in expected:
        assert f"deployment file {deployment}{problem}" in err, err
    assert not sim_processes(label)
    assert not outputs_dir.exists()
    deployment.write_text(deployment.read_text().replace("-2", "2").replace("lats", "last").replace("-1", "1"))
    assert main(["validate", "--no-deep"]) == 1, "a rule of the section, once its fields are valid"
    said = capsys.readouterr().out
    assert ":5:11: pipelines.remote_eval.sim.url: 'factory' and 'url' exclude each other" in said, said
    deployment.write_text(deployment.read_text().replace("send_ahead: 2", "send_ahead: -2"))
    defs = build_definitions(pipelines_dir)  # the code location: every pipeline loads, the file is marked
    assert {"remote_eval", "other_eval"} <= {job.name for job in defs.resolve_all_job_defs()}
    marker = defs.resolve_assets_def(dg.AssetKey(["broken_pipelines", "deployment_yaml"]))
    description = marker.descriptions_by_key[marker.key] or ""
    assert "is not a valid deployment file**: the runs it configures fail until it is fixed" in description
    assert description.count("send_ahead") == 1, "a field set for every pipeline is said once"


def test_a_deployment_file_refuses_a_misspelled_top_level_key_and_unexpanded_interpolation_but_takes_env_fields(
    tmp_path: Path,
    write_pipeline: WritePipeline,
    pipelines_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``exectuion:`` left every run in process, silently (and ``validate`` read the file as a broken pipeline);
    ``token: ${SIM_TOKEN}`` was sent as written; a served sim whose url or token comes from the environment was
    refused for lacking them."""
    from hud_pipelines.cli.main import main
    from hud_pipelines.dagster.deployed import deployed_spec, deployment_misfit
    from hud_pipelines.dagster.deployment import DeploymentError, load_deployment
    from hud_pipelines.spec.loader import load_pipeline

    path = write_pipeline("served_eval")
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("exectuion:\n  executor: celery\npipelines:\n  served_eval: {}\n")
    with pytest.raises(
        DeploymentError, match=r"deployment.yaml:1:1: exectuion: unknown key \(did you mean 'execution'"
    ):
        load_deployment(deployment)
    assert main(["validate", "--no-deep", str(deployment)]) == 1
    said = capsys.readouterr().out
    assert "exectuion: unknown key (did you mean 'execution'?)" in said
    assert "missing required key 'name'" not in said, "read as the deployment file it is"
    deployment.write_text(
        "pipelines:\n  served_eval:\n    sim: {factory: null, url: 'ws://h:1', token: '${SIM_TOKEN}'}\n"
    )
    with pytest.raises(DeploymentError, match=r":3:43: pipelines.served_eval.sim.token: '\$\{...\}' is not expanded"):
        load_deployment(deployment)
    spec = load_pipeline(path)
    for fields in (
        "{factory: null, args: {}, url: {env: SIM_URL}, token: {env: SIM_TOKEN}}",
        "{factory: null, args: {}, url: 'ws://h:1', token: {env: T}}",
    ):
        deployment.write_text(f"pipelines:\n  served_eval:\n    sim: {fields}\n")
        assert deployment_misfit(spec, load_deployment(deployment), deployment) is None, fields
    deployment.write_text("pipelines:\n  served_eval:\n    sim: {num_envs: {env: NENV}}\n")  # a number, read later
    assert deployment_misfit(spec, load_deployment(deployment), deployment) is None
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(deployment))
    monkeypatch.setenv("NENV", "3")
    assert deployed_spec(spec, tmp_path).sim.num_envs == 3, "read as the number it is"
    monkeypatch.setenv("NENV", "many")
    with pytest.raises(
        DeploymentError, match=r"sim\.num_envs: environment variable NENV holds 'many': expected an int"
    ):
        deployed_spec(spec, tmp_path)
    from hud_pipelines.cli.selection import refuse_misconfigured

    deployment.write_text(  # a run reads an {env: NAME} field when it starts: unset, it is refused in a line
        "pipelines:\n  served_eval:\n    sim: {factory: null, args: {}, url: 'ws://h:1', token: {env: UNSET_TOKEN}}\n"
    )
    with pytest.raises(DeploymentError, match=r"sim\.token: environment variable UNSET_TOKEN is not set"):
        refuse_misconfigured(path, spec, EvalOutputs(tmp_path / "outputs", spec.name))
    monkeypatch.delenv("HUD_PIPELINES_DEPLOYMENT")
    deployment.write_text(  # every problem at once: a name no pipeline has beside another pipeline's bad value
        "pipelines:\n  served_evl: {sim: {num_envs: 2}}\n  served_eval: {sim: {num_envs: 0, bogus: 1}}\n"
    )
    assert main(["validate", "--no-deep", str(deployment), str(pipelines_dir)]) == 1
    said = capsys.readouterr().out
    for problem in ("pipelines.served_evl: no pipeline", "served_eval.sim.bogus: not a field", "num_envs: expected"):
        assert problem in said, said
    deployment.write_text(
        "pipelines:\n  served_eval:\n    graders: {checks: [{kind: min_success_rate, threshold: 2}]}\n"
    )
    misfit = deployment_misfit(spec, load_deployment(deployment), deployment) or ""
    assert "pipelines.served_eval.graders.checks.0.value: missing required key 'value'" in misfit, "a file's words"
    assert "pipelines.served_eval.graders.checks.0.threshold: unknown key 'threshold'" in misfit
    deployment.write_text("pipelines:\n  served_eval:\n    sim: {url: {env: SIM_URL}, token: {env: SIM_TOKEN}}\n")
    misfit = deployment_misfit(spec, load_deployment(deployment), deployment)
    assert misfit is not None, "beside the YAML's factory"
    assert "'factory' and 'url' exclude each other" in misfit


def test_a_pipeline_as_deployed_reads_its_env_fields_now_and_names_one_that_is_not_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hud_pipelines.dagster.deployed import deployed_spec
    from hud_pipelines.errors import DeploymentError
    from hud_pipelines.spec.loader import load_pipeline_text

    spec = load_pipeline_text(
        json.dumps({"name": "a", "sim": {"factory": "CartPole-v1"}, "agent": {"policy": {"kind": "random"}}}),
        source=tmp_path / "a.yaml",
    )
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(
        "pipelines:\n  a: {sim: {factory: null, url: {env: SIM_URL}, token: {env: SIM_TOKEN}}, agent: {horizon: 3}}\n"
    )
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(deployment))
    monkeypatch.setenv("SIM_URL", "ws://127.0.0.1:9")
    monkeypatch.setenv("SIM_TOKEN", "secret")
    deployed = deployed_spec(spec, tmp_path)
    assert deployed.sim.url == "ws://127.0.0.1:9", "the variable's value, not its name"
    assert deployed.agent.horizon == 3
    assert deployed.rollout_hash != spec.rollout_hash
    monkeypatch.delenv("SIM_URL")
    with pytest.raises(DeploymentError, match=r":2:\d+: pipelines\.a\.sim\.url: environment variable SIM_URL is not"):
        deployed_spec(spec, tmp_path)
    deployment.write_text(  # set for every pipeline: the key that set it, at its line
        "pipelines:\n  a: {sim: {factory: null}, agent: {horizon: 3}}\n"
        "  '*': {sim: {url: {env: SIM_URL}, token: {env: SIM_TOKEN}}}\n"
    )
    with pytest.raises(DeploymentError, match=r":3:\d+: pipelines\.\*\.sim\.url: environment variable SIM_URL is not"):
        deployed_spec(spec, tmp_path)
    monkeypatch.setenv("SIM_URL", "ws://127.0.0.1:9")
    assert deployed_spec(spec, tmp_path).sim.url == "ws://127.0.0.1:9"


def test_validate_under_a_deployment_file_shows_the_figures_a_run_has_and_says_it_checked_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    pipeline = tmp_path / "a.yaml"
    pipeline.write_text(
        json.dumps(
            {"name": "a", "sim": {"factory": "CartPole-v1", "num_envs": 4}, "agent": {"policy": {"kind": "random"}}}
        )
    )
    assert main(["validate", "--no-deep", str(pipeline)]) == 0
    said = capsys.readouterr().out
    assert "of 4 slot(s), 4 episodes)" in said
    assert "deployment file" not in said, "none is set: none is named"
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("pipelines:\n  a: {sim: {num_envs: 2}, agent: {horizon: 3}}\n")
    monkeypatch.setenv("HUD_PIPELINES_DEPLOYMENT", str(deployment))
    assert main(["validate", "--no-deep", str(pipeline)]) == 0
    said = capsys.readouterr().out
    assert f"of 2 slot(s), 2 episodes); {deployment} sets sim.num_envs, agent.horizon" in said, said
    assert f"ok  {deployment}: deployment file (executor in_process, 1 pipeline setting(s))" in said, said


def test_a_deployment_naming_a_pipeline_that_does_not_exist_is_refused_with_the_closest_name(
    tmp_path: Path,
    write_pipeline: WritePipeline,
    pipelines_dir: Path,
    outputs_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hud_pipelines.cli.main import main
    from hud_pipelines.dagster.deployment import DEPLOYMENT_ENV, DeploymentError, load_deployment, refuse_misspelled

    write_pipeline("remote_eval")
    (pipelines_dir / "broken.yaml").write_text("name: remote_eval_camera\nmax_steps: -5\n")  # a file that fails
    misspelled = tmp_path / "deployment.yaml"
    misspelled.write_text(
        "pipelines:\n  remote_evl:\n    sim: {num_envs: 3}\n  remote_eval_camera:\n    sim: {num_envs: 2}\n"
    )
    monkeypatch.setenv(DEPLOYMENT_ENV, str(misspelled))
    expected = rf"{misspelled}:2:3: pipelines\.remote_evl: no pipeline of that name \(did you mean 'remote_eval'\?\)"
    defs = build_definitions(pipelines_dir, outputs_dir=outputs_dir)  # every pipeline still loads, the file is marked
    assert "remote_eval" in {job.name for job in defs.resolve_all_job_defs()}
    markers = [key.path for key in defs.resolve_asset_graph().get_all_asset_keys() if key.path[0] == "broken_pipelines"]
    assert ["broken_pipelines", "deployment_yaml"] in markers, markers
    with dg.DagsterInstance.ephemeral() as instance:  # its runs are refused, not run on the YAML's own sims
        run = defs.resolve_job_def("remote_eval").execute_in_process(instance=instance, raise_on_error=False)
    assert not run.success
    [failure] = [event for event in run.all_events if event.is_step_failure]
    said = failure.step_failure_data.error.to_string() if failure.step_failure_data.error else ""
    assert re.search(expected, said), said
    assert not (outputs_dir / "remote_eval" / "rollouts").exists(), "no instance ran"
    beside = ["remote_eval", "remote_eval_camera"]  # what the run's pipelines folder declares, broken files too
    with pytest.raises(DeploymentError, match=expected):
        refuse_misspelled(load_deployment(), "remote_eval", beside)  # a run of the one pipeline it meant
    refuse_misspelled(load_deployment(), "other_pipeline", beside)  # a name far from it may serve another project
    refuse_misspelled(load_deployment(), "remote_eval2", [*beside, "remote_eval2"])  # remote_eval's typo, not its own
    misspelled.write_text("pipelines:\n  remote_eval_camera:\n    sim: {num_envs: 2}\n")
    refuse_misspelled(load_deployment(), "remote_eval", beside)  # close, but a pipeline of its own
    misspelled.write_text("pipelines:\n  remote_evl:\n    sim: {num_envs: 3}\n")
    monkeypatch.chdir(pipelines_dir.parent)
    assert main(["validate", "--no-deep"]) == 1, "validate reads the deployment file too"
    assert "pipelines.remote_evl: no pipeline of that name (did you mean 'remote_eval'?)" in capsys.readouterr().out
    assert main(["validate", "--no-deep", str(pipelines_dir / "remote_eval.yaml")]) == 1, "one file: its typo"
    assert "pipelines.remote_evl: no pipeline of that name (did you mean 'remote_eval'?)" in capsys.readouterr().out
    misspelled.write_text("pipelines:\n  other_project:\n    sim: {num_envs: 3}\n")
    assert main(["validate", "--no-deep", str(pipelines_dir / "remote_eval.yaml")]) == 0, "far from it: another's"
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    assert main(["run", str(pipelines_dir / "remote_eval.yaml"), "--quiet"]) == 0, "and runs: a code location refuses"
    second = write_pipeline("pusher_eval")
    misspelled.write_text("pipelines:\n  remote_evl:\n    sim: {num_envs: 3}\n  pusher_evl:\n    sim: {num_envs: 2}\n")
    assert main(["validate", "--no-deep", str(pipelines_dir / "remote_eval.yaml"), str(second)]) == 1
    out = capsys.readouterr().out
    assert "pipelines.remote_evl: no pipeline" in out, "every validated file's misspelling, not the first alone"
    assert "pipelines.pusher_evl: no pipeline" in out
    misspelled.write_text("pipelines:\n  remote_eval:\n    sim: {num_envs: 3}\n  remote_evl:\n    sim: {num_envs: 3}\n")
    assert main(["validate", "--no-deep", str(pipelines_dir)]) == 1, "the folder named is the whole folder"
    assert "pipelines.remote_evl: no pipeline of that name" in capsys.readouterr().out

    monkeypatch.delenv(DEPLOYMENT_ENV)  # a deployment file given to validate is checked as one, not as a pipeline
    assert main(["validate", str(misspelled)]) == 1
    said = capsys.readouterr().out
    assert "pipelines.remote_evl: no pipeline of that name (did you mean 'remote_eval'?)" in said
    assert "missing required key 'name'" not in said
    misspelled.write_text("execution: {executor: celery, broker: 'redis://h/0'}\npipelines:\n  remote_eval: {}\n")
    assert main(["validate", str(misspelled)]) == 0
    assert "deployment file (executor celery, 1 pipeline setting(s))" in capsys.readouterr().out
    other = tmp_path / "other_pipelines"  # the folder given beside it holds the pipelines it names
    other.mkdir()
    (other / "other_eval.yaml").write_text(
        (pipelines_dir / "remote_eval.yaml").read_text().replace("remote_eval", "other_eval")
    )
    misspelled.write_text("pipelines:\n  other_eval: {}\n")
    assert main(["validate", "--no-deep", str(other), str(misspelled)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    faults = "execution: {executor: celery, broker: 'redis://h/0', retries: -1}\npipelines:\n"
    misspelled.write_text(faults + "  remote_evl:\n    sim: {num_env: 3}\n    agent: {horizon: 0.5}\n")
    assert main(["validate", "--no-deep", str(pipelines_dir), str(misspelled)]) == 1
    said = capsys.readouterr().out
    for problem in (  # every one at once, each at its line, in a pipeline file's words
        ":4:11: pipelines.remote_evl.sim.num_env: not a field of the sim resource (did you mean 'num_envs'?)",
        ":5:13: pipelines.remote_evl.agent.horizon: expected a whole number, got 0.5",
        ":1:54: execution.retries: expected a number >= 0, got -1",
        ":3:3: pipelines.remote_evl: no pipeline of that name (did you mean 'remote_eval'?)",
    ):
        assert problem in said, said


def test_every_setting_of_the_sim_and_agent_sections_is_a_field_of_its_resource() -> None:
    """A YAML key the resource lacks would fail every run, and the code location, of a pipeline that sets it."""
    from hud_pipelines.dagster.resources import AgentResource, ContractResource, SimResource
    from hud_pipelines.spec.agent import AgentConfig
    from hud_pipelines.spec.sim_section import SimSpec

    assert set(SimSpec.model_fields) - {"contract"} <= set(SimResource.model_fields)
    assert "file" in ContractResource.model_fields, "the sim's contract file is the contract resource's"
    assert set(AgentConfig.model_fields) <= set(AgentResource.model_fields)


def test_a_served_sims_busy_timeout_reaches_the_pool_through_the_resources(tmp_path: Path) -> None:
    from hud_pipelines.dagster.resources import pipeline_resources
    from hud_pipelines.spec.loader import load_pipeline

    path = tmp_path / "waits.yaml"
    sim = {"url": "ws://127.0.0.1:1", "token": "t", "busy_timeout_s": 3}
    path.write_text(json.dumps({"name": "waits", "sim": sim, "agent": {"policy": {"kind": "constant"}}}))
    spec = load_pipeline(path)
    resources = pipeline_resources(spec, project_dir=REPO)
    assert resources.sim.busy_timeout_s == 3
    assert resources.sim.pool(spec).settings.busy_timeout_s == 3


def test_the_readmes_deployment_example_is_a_valid_deployment_of_the_bundled_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's example attached cartpole_pd to a served sim beside the YAML's contract file, which a
    served sim may not have: every run of it failed its first step."""
    from hud_pipelines.cli.main import main

    readme = (REPO / "README.md").read_text()
    block = readme.split("for example a sim fleet served elsewhere:\n\n```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "deployment.yaml").write_text(block)
    assert main(["validate", "--no-deep", str(tmp_path / "deployment.yaml"), str(REPO / "pipelines")]) == 0, (
        capsys.readouterr().out
    )
    # without the line that clears the YAML's contract file (a spawned sim's), the problem says how to clear it
    (tmp_path / "deployment.yaml").write_text(block.replace("contract: {file: null}", "agent: {}"))
    assert main(["validate", "--no-deep", str(tmp_path / "deployment.yaml"), str(REPO / "pipelines")]) == 1
    said = capsys.readouterr().out
    assert "set contract: {file: null} under pipelines.cartpole_pd to clear it)" in said, said


def test_evaluates_deployment_fields_are_held_to_a_deployment_files_rules(tmp_path: Path) -> None:
    """``evaluate(deployment=...)`` raised a bare ``KeyError`` for a misspelled field, ran with the YAML's values for
    a misspelled resource, and passed a wrong type on to Dagster's own error."""
    from hud_pipelines.errors import DeploymentError
    from hud_pipelines.eval.steps import evaluate
    from hud_pipelines.spec.loader import load_pipeline

    spec = load_pipeline(REPO / "pipelines" / "cartpole.yaml")
    bad = {"sim": {"num_envz": 1, "num_envs": "two"}, "simm": {"num_envs": 1}}
    with pytest.raises(DeploymentError) as refused:
        evaluate(spec, outputs_dir=tmp_path, project_dir=REPO, deployment=bad)
    said = str(refused.value).splitlines()
    assert said[0].startswith("deployment['sim']['num_envz']: not a field of the sim resource (did you mean 'num_envs'")
    assert said[1].startswith("deployment['sim']['num_envs']: ")
    assert (
        said[2]
        == "deployment['simm']: not a resource (did you mean 'sim'?); expected one of sim, contract, agent, graders"
    )
    assert not (tmp_path / spec.name).exists(), "refused before anything ran"


def test_a_deployment_file_that_is_not_utf8_is_refused_naming_it_and_validate_goes_on(tmp_path: Path) -> None:
    """A Latin-1 accent in a deployment file was a UnicodeDecodeError traceback, from ``run`` and ``validate``."""
    from hud_pipelines.dagster.deployment import DeploymentError, is_deployment_file, load_deployment

    path = tmp_path / "deploy.yaml"
    path.write_bytes("# d\xe9ploiement\npipelines: {}\n".encode("latin-1"))
    with pytest.raises(DeploymentError, match=f"deployment file {path}: not UTF-8 text"):
        load_deployment(path)
    assert not is_deployment_file(path), "validated as what else it may be, which says what is wrong with it"


def test_a_deployment_file_with_a_key_twice_is_validated_as_one_and_refused_at_the_second(tmp_path: Path) -> None:
    """It was validated as a pipeline file: "missing required key 'name'" and "unknown key 'pipelines'"."""
    from hud_pipelines.dagster.deployment import DeploymentError, is_deployment_file, load_deployment

    path = tmp_path / "deploy.yaml"
    path.write_text("pipelines:\n  a:\n    sim: {num_envs: 2}\n  a:\n    sim: {num_envs: 3}\n")
    assert is_deployment_file(path)
    with pytest.raises(DeploymentError, match=rf"deployment file {path}:4:3: invalid YAML: found duplicate key \"a\""):
        load_deployment(path)
