"""A fleet of served sims (``sim.urls``): instances spread over the servers, a dead one is named and avoided."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hud_pipelines.errors import Fault
from hud_pipelines.eval.grades import GradeRow
from hud_pipelines.eval.results import InstanceResult
from hud_pipelines.eval.steps import evaluate
from hud_pipelines.spec.loader import load_pipeline_text
from hud_pipelines.wire.messages import CLOSING_WAIT_S
from tests.dagster.support import REPO, SIMS
from tests.sim.fleet_support import TOKEN, serve_cartpole, stop_served

pytestmark = pytest.mark.slow


@pytest.fixture(name="fleet")
def fleet_fixture() -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    """Two served CartPole sims that kill their own process at step 5 of an episode of seed 4."""
    servers = [serve_cartpole("--arg", "crash_seeds=[4]") for _ in range(2)]
    yield servers
    for process, _ in servers:
        stop_served(process)


def _spec(tmp_path: Path, urls: list[str], monkeypatch: pytest.MonkeyPatch, *, num_envs: int = 2) -> Any:
    monkeypatch.setenv("HUD_TEST_FLEET_TOKEN", TOKEN)
    return load_pipeline_text(_text(urls, num_envs), source=tmp_path / "fleet.yaml")


def _text(urls: list[str], num_envs: int = 2) -> str:
    text = {
        "name": "fleet",
        "sim": {"urls": urls, "token": "${HUD_TEST_FLEET_TOKEN}", "num_envs": num_envs, "step_timeout_s": 10},
        "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
        "group": 4,
        "max_concurrent": 2,
        "max_steps": 30,
        "graders": [{"kind": "return", "threshold": 25}],
    }
    return json.dumps(text)


def test_instances_spread_over_the_fleet_and_a_server_that_dies_is_named_and_avoided(
    fleet: list[tuple[subprocess.Popen[bytes], str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    urls = [url for _, url in fleet]
    evaluation = evaluate(_spec(tmp_path, urls, monkeypatch), outputs_dir=tmp_path / "out")
    results = {r.instance: r for r in evaluation.results}
    assert {results[0].server, results[1].server} == set(urls), "the first two instances run side by side"
    crashed = results[2]  # seeds 4 and 5: its server kills itself at step 5
    assert crashed.failed
    assert crashed.server is not None
    assert f"served sim {crashed.server}" in (crashed.error or "")
    assert crashed.fault in {Fault.SIM_CRASHED, Fault.SIM_LINK}
    survivor = next(url for url in urls if url != crashed.server)
    assert not results[3].failed
    assert results[3].server == survivor, "no instance is sent to the server that died"
    assert [p.poll() is None for p, url in fleet] == [url == survivor for _, url in fleet]
    assert {row.instance for row in evaluation.rows if row.fault is not None} == {2}
    stored = InstanceResult.read(tmp_path / "out" / "fleet" / "rollouts" / "task0-i0.json")
    assert stored.server == results[0].server


def test_a_fleet_whose_servers_are_all_down_errors_every_instance_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    process, url = serve_cartpole()
    stop_served(process)
    evaluation = evaluate(_spec(tmp_path, [url], monkeypatch), outputs_dir=tmp_path / "out")
    assert all(r.failed for r in evaluation.results)
    assert all(url in (r.error or "") for r in evaluation.results)
    assert {row.fault for row in evaluation.rows} == {Fault.SIM_START}, "a server never reached did not crash"
    assert {r.server for r in evaluation.results} == {url}, "each result names the server it tried"


def test_a_server_of_the_fleet_that_is_down_is_passed_over_naming_it_and_its_instance_runs_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the instance that tried it failed (``sim_start``), with nothing measured: on Celery, where every
    unit has a pool of its own and none learns of another's loss, one server down failed every instance."""
    monkeypatch.chdir(REPO)
    (live, live_url), (down, down_url) = serve_cartpole(), serve_cartpole()
    stop_served(down)
    try:
        with caplog.at_level("WARNING", logger="hud_pipelines.sim.pool"):
            evaluation = evaluate(_spec(tmp_path, [down_url, live_url], monkeypatch), outputs_dir=tmp_path / "out")
    finally:
        stop_served(live)
    assert not [r for r in evaluation.results if r.failed]
    assert {r.server for r in evaluation.results} == {live_url}
    said = [r.getMessage() for r in caplog.records if r.name == "hud_pipelines.sim.pool"]
    [warned] = said  # once: the server is lost, and no later instance is sent there
    assert warned.startswith(f"served sim {down_url}: cannot connect to the sim at {down_url}: "), warned
    assert warned.endswith("; the instance goes on to another server of the fleet"), warned
    stop_served(live)
    alone = evaluate(_spec(tmp_path, [down_url], monkeypatch), outputs_dir=tmp_path / "alone")  # none left: an error
    assert {(r.server, r.fault) for r in alone.results} == {(down_url, Fault.SIM_START)}
    named = f"served sim {down_url}: cannot connect to the sim at {down_url}"
    assert all(named in (r.error or "") for r in alone.results), [r.error for r in alone.results]


def test_a_served_sim_with_other_slots_than_the_pipeline_errors_every_instance_naming_both_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    process, url = serve_cartpole()  # two slots
    try:
        evaluation = evaluate(_spec(tmp_path, [url], monkeypatch, num_envs=3), outputs_dir=tmp_path / "out")
    finally:
        stop_served(process)
    assert len(evaluation.results) == 4
    assert all(r.failed for r in evaluation.results)
    expected = f"served sim {url}: it serves 2 slot(s), but the pipeline's sim.num_envs is 3"
    assert all(expected in (r.error or "") for r in evaluation.results), [r.error for r in evaluation.results]
    assert len(evaluation.rows) == 3 * 4, "every scheduled episode still gets its row"
    assert {row.fault for row in evaluation.rows} == {Fault.SIM_START}


def test_a_wrong_token_errors_every_instance_naming_the_refusal_not_a_lost_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    process, url = serve_cartpole(token="the-right-token")
    try:
        evaluation = evaluate(_spec(tmp_path, [url], monkeypatch), outputs_dir=tmp_path / "out")
    finally:
        stop_served(process)
    errors = [r.error or "" for r in evaluation.results]
    assert len(errors) == 4
    assert all(f"served sim {url}: " in e and "HTTP 401" in e for e in errors), errors


def test_a_fleet_file_reaches_each_server_with_its_own_token_and_a_wrong_one_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    (a, url_a), (b, url_b) = serve_cartpole(token="token-of-a"), serve_cartpole(token="token-of-b")
    try:
        monkeypatch.setenv("HUD_TEST_TOKEN_A", "token-of-a")
        monkeypatch.setenv("HUD_TEST_TOKEN_B", "token-of-b")
        fleet = tmp_path / "lab.yaml"
        fleet.write_text(
            f"token: ${{HUD_TEST_TOKEN_A}}\nservers:\n  - {url_a}\n  - url: {url_b}\n    token: ${{HUD_TEST_TOKEN_B}}\n"
        )
        text = {
            "name": "lab",
            "sim": {"fleet": "lab.yaml", "num_envs": 2, "step_timeout_s": 10},
            "agent": {"policy": {"kind": "scripted", "target": "envs.controllers:CartPolePD"}},
            "group": 2,
            "max_concurrent": 2,
            "max_steps": 20,
        }
        spec = load_pipeline_text(json.dumps(text), source=tmp_path / "lab_eval.yaml")
        evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
        assert not any(r.failed for r in evaluation.results)
        assert {r.server for r in evaluation.results} == {url_a, url_b}, "each server reached with its own token"

        monkeypatch.setenv("HUD_TEST_TOKEN_B", "not-b-s-token")
        spec = load_pipeline_text(json.dumps(text), source=tmp_path / "lab_eval.yaml")
        evaluation = evaluate(spec, outputs_dir=tmp_path / "wrong")
        [refused] = [r for r in evaluation.results if r.failed]  # only the instance sent to b
        assert f"served sim {url_b}: " in (refused.error or "")
        assert "HTTP 401" in (refused.error or "")
        assert refused.fault is Fault.SIM_START, (
            "refused before any request: it never started (an earlier result stays)"
        )
        [served] = [r for r in evaluation.results if not r.failed]
        assert served.server == url_a

        fleet.write_text(  # b first: the contract comes from a, and b gets no instance
            f"token: ${{HUD_TEST_TOKEN_A}}\nservers:\n  - url: {url_b}\n    token: ${{HUD_TEST_TOKEN_B}}\n  - {url_a}\n"
        )
        spec = load_pipeline_text(json.dumps(text), source=tmp_path / "lab_eval.yaml")
        evaluation = evaluate(spec, outputs_dir=tmp_path / "first")
        assert [(r.server, r.failed) for r in evaluation.results] == [(url_a, False), (url_a, False)]
    finally:
        stop_served(a)
        stop_served(b)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_fleet_server_started_with_other_arguments_errors_its_instances_naming_both_sims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    servers = [serve_cartpole("--arg", "crash_seeds=[]"), serve_cartpole("--arg", "crash_seeds=[99]")]
    try:
        evaluation = evaluate(_spec(tmp_path, [url for _, url in servers], monkeypatch), outputs_dir=tmp_path / "out")
    finally:
        for process, _ in servers:
            stop_served(process)
    failed = [r for r in evaluation.results if r.failed]
    assert len(failed) == 1, "the other server is lost after its first instance: the rest run on the first"
    assert failed[0].fault is Fault.SIM_START
    error = failed[0].error or ""
    assert "it serves sims.py:cartpole with" in error
    assert "but this run's served sim is sims.py:cartpole" in error
    assert '{"crash_seeds": []}' in error
    assert '{"crash_seeds": [99]}' in error
    ran = {r.server for r in evaluation.results if not r.failed}
    assert len(ran) == 1
    assert failed[0].server not in ran
    assert f"(served by {next(iter(ran))}, the first this run met)" in error, "the server it is compared with"
    assert "start them alike, or list only the servers of the sim to evaluate" in error
    [claim] = (tmp_path / "out" / "fleet" / "served_sims").glob("*.json")
    served = json.loads(claim.read_text())
    assert f"this run's served sim is sims.py:cartpole with {json.dumps(served['args'])}" in error, "the contract's"


def test_results_of_a_server_restarted_with_other_arguments_are_not_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    port = str(_free_port())
    process, url = serve_cartpole("--port", port, "--arg", "crash_seeds=[]")
    try:
        first = evaluate(_spec(tmp_path, [url], monkeypatch), outputs_dir=tmp_path / "out")
    finally:
        stop_served(process)
    assert not any(r.failed for r in first.results)
    stored = InstanceResult.read(tmp_path / "out" / "fleet" / "rollouts" / "task0-i0.json").provenance
    assert stored["sim_args"] == {"crash_seeds": []}, "the server's arguments, not the YAML's"
    assert stored["sim_factory"].endswith("sims.py:cartpole")
    process, again = serve_cartpole("--port", port, "--arg", "crash_seeds=[99]")
    try:
        assert again == url
        spec = _spec(tmp_path, [url], monkeypatch)
        second = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partition_for_key("task0-i1")])
    finally:
        stop_served(process)
    _assert_only_instance_1_current(second, "the served sim sims.py:cartpole with")


def test_results_of_a_served_sim_whose_code_changed_are_not_merged_and_the_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server sends its code's digests: an edit of its factory's file is seen as for a spawned sim."""
    monkeypatch.chdir(REPO)
    sims = tmp_path / "served" / "sims.py"
    sims.parent.mkdir()
    sims.write_text(SIMS.read_text())
    port = str(_free_port())
    process, url = serve_cartpole("--port", port, sims=sims)
    try:
        spec = _spec(tmp_path, [url], monkeypatch)
        first = evaluate(spec, outputs_dir=tmp_path / "out")
        again = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partition_for_key("task0-i0")])
    finally:
        stop_served(process)
    assert not any(r.failed for r in first.results)
    assert all(row.fault is None for row in again.rows), "the same code: every result is current"
    sims.write_text(sims.read_text() + "\n# an edit of the served sim's code\n")
    process, _ = serve_cartpole("--port", port, sims=sims)
    try:
        spec = _spec(tmp_path, [url], monkeypatch)
        second = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partition_for_key("task0-i1")])
    finally:
        stop_served(process)
    _assert_only_instance_1_current(second, "the served sim's code changed: sims.py")


def _assert_only_instance_1_current(evaluation: Any, reason: str) -> None:
    """Instance 1 ran again; the others' results are another sim's, not run with this one: ``reason`` says why."""
    stale = [row for row in evaluation.rows if row.instance != 1]
    assert stale
    assert all(row.fault is Fault.NOT_RUN for row in stale)
    assert all(reason in (row.error or "") for row in stale), stale[0].error
    assert all(row.fault is None for row in evaluation.rows if row.instance == 1)


def test_a_run_that_meets_no_served_sim_keeps_every_earlier_result_and_fails_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An instance whose sim is down measured nothing: its earlier result of the same configuration stays
    (it was wiped by errored rows), and the run still fails, naming the sim and what runs it again."""
    from hud_pipelines.cli.main import main
    from hud_pipelines.eval.kept import kept_failure
    from hud_pipelines.eval.outputs import EvalOutputs

    monkeypatch.chdir(REPO)
    port = str(_free_port())
    process, url = serve_cartpole("--port", port)
    try:
        first = evaluate(_spec(tmp_path, [url], monkeypatch), outputs_dir=tmp_path / "out")
    finally:
        stop_served(process)
    spec = _spec(tmp_path, [url], monkeypatch)  # the server is down now
    down = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partition_for_key("task0-i1")])
    assert down.rows == first.rows, "every result as the first run left it"
    [attempt] = down.failed_instances
    assert (attempt.key, attempt.fault) == ("task0-i1", Fault.SIM_START)
    assert "cannot connect to the sim" in (attempt.error or "")
    assert not down.passed, "nothing ran: the evaluation failed"
    outputs = EvalOutputs(tmp_path / "out", "fleet")
    assert InstanceResult.read(outputs.result("task0-i1")).run_id == first.run_id
    said = kept_failure(spec, outputs, down.results)
    assert said is not None
    assert "instance(s) task0-i1 did not start (sim_start: " in said
    assert f"cannot connect to the sim at {url}" in said
    assert f"their results of run {first.run_id} are kept" in said
    assert said.endswith(
        f"\nrun them again once they can start: hud-pipelines run {tmp_path / 'fleet.yaml'} --outputs {outputs.root} "
        "--partition task0-i1"
    )

    home = tmp_path / "home"  # the CLI's run: a Dagster run that fails with that reason, the grades as they were
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    (tmp_path / "fleet.yaml").write_text(_text([url]))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "fleet.yaml"), "--quiet", "--outputs", str(tmp_path / "out")]) == 1
    printed = capsys.readouterr().out
    assert "step fleet__eval failed: instance(s) task0-i0, task0-i1, task0-i2, task0-i3 did not start" in printed
    assert "are kept, as nothing ran to replace them" in printed, printed[-3000:]
    asked = f"hud-pipelines run {tmp_path / 'fleet.yaml'} --outputs {tmp_path / 'out'} --partition task0-i0"
    assert f"replace them / run them again once they can start: {asked}" in printed, "as this run was asked"
    grades = [GradeRow.from_dict(row) for row in json.loads(outputs.grades_json.read_text())]
    assert grades == first.rows, "the grades, written again after the failed step, are the kept results"
    completed = json.loads(outputs.checks_json.read_text())[0]  # those would pass it: the run's failure does not
    assert (completed["name"], completed["passed"]) == ("instances_completed", False)
    assert completed["description"].startswith("this run failed: fleet__eval failed: instance(s) task0-i0")
    assert (
        "**Warning:** this run failed, so these are the results it kept of earlier runs"
        in outputs.report_md.read_text()
    )


def test_units_claiming_a_runs_served_sim_at_once_all_get_the_first_claim(tmp_path: Path) -> None:
    import multiprocessing

    from hud_pipelines.eval.configuration import claim_served_sim
    from hud_pipelines.eval.outputs import EvalOutputs

    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as workers:
        claims = workers.starmap(_claim_many, [(tmp_path, "a"), (tmp_path, "b")])
    assert claims[0] == claims[1], "each run's first claim holds for every unit of it"
    assert set(claims[0]) <= {"a", "b"}
    outputs = EvalOutputs(tmp_path, "fleet")
    assert claim_served_sim(outputs, "run-0", {"factory_name": "c"}) == {"factory_name": claims[0][0]}


def _claim_many(root: Path, name: str) -> list[str]:
    from hud_pipelines.eval.configuration import claim_served_sim
    from hud_pipelines.eval.outputs import EvalOutputs

    outputs = EvalOutputs(root, "fleet")
    return [claim_served_sim(outputs, f"run-{i}", {"factory_name": name})["factory_name"] for i in range(60)]


def test_an_instance_waits_for_a_served_sim_another_process_drives_and_never_loses_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two pools on one server stand for two Celery workers of one run: neither knows what the other holds."""
    from hud_pipelines.sim.pool import SimPool
    from hud_pipelines.sim.settings import SimSettings

    process, url = serve_cartpole()
    settings = SimSettings(num_envs=2, servers=((url, TOKEN),))
    holder, waiter = SimPool(settings), SimPool(settings)
    got: list[str] = []
    thread = threading.Thread(target=_take_once, args=(waiter, got))
    try:
        with holder.sim():
            thread.start()
            thread.join(timeout=1.5)
            assert thread.is_alive(), "the second instance waits while the first drives the sim"
        holder.close()  # the first worker's unit ends: its pool lets go of the sim
        thread.join(timeout=20)
        assert got == [url], "once the first let go, the second got the same server"
        waits = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "busy" in r.getMessage()]
        assert waits == [
            f"served sim {url} is busy, driven by another client: waiting for it or another one "
            "(sim.busy_timeout_s = 600)"
        ], "said once, however often it was refused"
        with waiter.sim() as live:  # and did not lose it for the refusals it met
            assert live.server == url
    finally:
        holder.close(grace_s=0)
        waiter.close(grace_s=0)
        thread.join(timeout=10)
        stop_served(process)


def _take_once(pool: Any, got: list[str]) -> None:
    with pool.sim() as live:
        got.append(live.server)


def test_a_served_sim_busy_past_busy_timeout_errors_the_instance_as_a_start_failure_naming_why() -> None:
    from hud_pipelines.errors import SimStartError, fault_of
    from hud_pipelines.sim.pool import SimPool
    from hud_pipelines.sim.settings import SimSettings

    process, url = serve_cartpole()
    holder = SimPool(SimSettings(num_envs=2, servers=((url, TOKEN),)))
    waiter = SimPool(SimSettings(num_envs=2, servers=((url, TOKEN),), busy_timeout_s=1.0))
    try:
        with holder.sim():
            started = time.monotonic()
            with pytest.raises(SimStartError) as refused, waiter.sim():
                pass
            assert 1.0 <= time.monotonic() - started < 10
        assert fault_of(refused.value) is Fault.SIM_START
        assert refused.value.server == url
        message = str(refused.value)
        assert f"served sim {url}: busy, driven by another client (HTTP 409)" in message
        assert "sim.busy_timeout_s = 1" in message, message
        holder.close()
        with waiter.sim() as live:  # busy is not lost: the next instance gets it once it is let go
            assert live.server == url
    finally:
        holder.close(grace_s=0)
        waiter.close(grace_s=0)
        stop_served(process)


def test_a_served_sim_that_hangs_gets_no_later_instance_of_its_run_nor_waits_the_next_run_per_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the server still busy with the step that never returned refused the next instance as busy
    (HTTP 409, "driven by another client"), and the run waited out ``busy_timeout_s`` (10 minutes by default);
    so did every instance of the next run, then said "busy". The server's 409 now says how long the gone
    connection's request has run: past the run's ``step_timeout_s``, the sim is hung, said at once. The next run's
    handshake waits out the server's :data:`CLOSING_WAIT_S`, so the 409 reaches it though ``step_timeout_s`` is
    shorter."""
    monkeypatch.chdir(REPO)
    process, url = serve_cartpole("--arg", "stall_seeds=[0]")  # slot 0 of instance 0 stalls at step 5
    try:
        text = json.loads(_text([url]))
        text["sim"] |= {"step_timeout_s": 2, "busy_timeout_s": 20}
        text |= {"group": 3, "max_concurrent": 1}
        monkeypatch.setenv("HUD_TEST_FLEET_TOKEN", TOKEN)
        spec = load_pipeline_text(json.dumps(text), source=tmp_path / "fleet.yaml")
        took: list[float] = []
        runs = []
        for outputs in ("first", "second"):
            started = time.monotonic()
            runs.append(evaluate(spec, outputs_dir=tmp_path / outputs))
            took.append(time.monotonic() - started)
    finally:
        stop_served(process)
    first, second = runs
    assert {r.instance: r.fault for r in first.results} == {0: Fault.SIM_HUNG, 1: Fault.SIM_START, 2: Fault.SIM_START}
    later = next(r for r in first.results if r.instance == 1)
    assert f"served sim {url} stopped answering (a step or reset hung)" in (later.error or ""), later.error
    # the next run's first connection (for the contract) meets it: no instance gets the sim
    assert {r.instance: r.fault for r in second.results} == dict.fromkeys(range(3), Fault.SIM_START)
    for result in second.results:
        error = result.error or ""
        assert f"served sim {url} is still running a request of a connection that has gone, with no reply" in error
        assert "(sim.step_timeout_s = 2): the env is presumed stuck in it; restart the server" in error, error
        assert "busy" not in error
    assert max(took) < 20, f"a run waited on the hung server as on a busy one ({took})"


def test_busy_timeout_is_refused_for_a_spawned_sim_naming_the_key(tmp_path: Path) -> None:
    from hud_pipelines.spec.problems import SpecError

    text = json.loads(_text(["ws://127.0.0.1:1"]))
    text["sim"] = {"factory": "CartPole-v1", "busy_timeout_s": 5}
    with pytest.raises(SpecError, match=r"sim\.busy_timeout_s.*a spawned sim is this run's own"):
        load_pipeline_text(json.dumps(text), source=tmp_path / "fleet.yaml")


def test_an_instance_whose_served_sim_dies_under_it_keeps_its_earlier_complete_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served machine lost mid-run is not the configuration's doing (the earlier run of it completed): the
    instance keeps what it measured then, and the run fails saying so."""
    from hud_pipelines.eval.kept import kept_failure
    from hud_pipelines.eval.outputs import EvalOutputs

    monkeypatch.chdir(REPO)
    armed = tmp_path / "crash"  # seeds are instance * 2 + slot: seed 4 is instance 2, which dies at step 5 when armed
    process, url = serve_cartpole("--arg", "crash_seeds=[4]", "--arg", f"crash_file={armed}")
    try:
        spec = _spec(tmp_path, [url], monkeypatch)
        first = evaluate(spec, outputs_dir=tmp_path / "out")
        assert first.passed
        armed.touch()
        again = evaluate(spec, outputs_dir=tmp_path / "out", partitions=[spec.partition_for_key("task0-i2")])
    finally:
        stop_served(process)
    [attempt] = again.failed_instances
    assert (attempt.key, attempt.fault) == ("task0-i2", Fault.SIM_CRASHED)
    assert again.rows == first.rows, "every result as the first run left it"
    outputs = EvalOutputs(tmp_path / "out", "fleet")
    assert InstanceResult.read(outputs.result("task0-i2")).run_id == first.run_id
    said = kept_failure(spec, outputs, again.results) or ""
    assert said.startswith("instance(s) task0-i2 did not complete (sim_crashed: "), said
    assert f"their results of run {first.run_id} are kept" in said


@pytest.mark.parametrize("otherwise", [False, True])
def test_a_served_sim_restarted_on_its_address_mid_run_takes_the_later_instances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, otherwise: bool
) -> None:
    """The instance on it when it died fails; the next waits for it to listen again, instead of failing on a
    server the run had written off the moment it went away. Restarted with other arguments, it is refused, said as
    the one address restarted otherwise (it was said as another server of a fleet)."""
    monkeypatch.chdir(REPO)
    first, url = serve_cartpole("--arg", "crash_seeds=[4]")  # it kills itself in instance 2 (seeds 4 and 5)
    servers = [first]
    label = ["--arg", "label=other"] if otherwise else []

    def restart() -> None:
        first.wait(timeout=60)
        time.sleep(0.3)  # the next instance has met the closed port by now
        servers.append(serve_cartpole("--arg", "crash_seeds=[4]", *label, "--port", url.rsplit(":", 1)[1])[0])

    restarting = threading.Thread(target=restart, daemon=True)
    restarting.start()
    try:
        spec = _spec(tmp_path, [url], monkeypatch)
        evaluation = evaluate(spec.model_copy(update={"max_concurrent": 1}), outputs_dir=tmp_path / "out")
        restarting.join(timeout=60)
    finally:
        for process in servers:
            stop_served(process)
    results = {r.instance: r for r in evaluation.results}
    assert [results[i].failed for i in range(4)] == [False, False, True, otherwise]
    assert results[2].fault is Fault.SIM_CRASHED
    assert results[3].server == url
    if otherwise:
        assert results[3].fault is Fault.SIM_START
        assert f"served sim {url}: it now serves " in (results[3].error or ""), results[3].error
        assert "at this address (restarted with other arguments or packages)" in (results[3].error or "")
        return
    assert {row.instance for row in evaluation.rows if row.fault is not None} == {2}


def test_a_served_sim_that_stopped_listening_and_stays_down_errors_the_instances_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hud_pipelines.errors import SimStartError
    from hud_pipelines.sim import fleet as fleet_module

    monkeypatch.setattr(fleet_module, "RETURN_GRACE_S", 0.5)
    servers = fleet_module.Fleet(["ws://127.0.0.1:9"])  # the discard port: nothing listens there
    server = servers.take()
    servers.lose(server, f"served sim {server} stopped listening", may_return=True)
    servers.give_back(server)
    started = time.monotonic()
    with pytest.raises(SimStartError, match=r"stopped listening \(and did not listen again within 0.5 s\)"):
        servers.take()
    assert 0.4 <= time.monotonic() - started < 5, "it waited out the grace, and no more"
    started = time.monotonic()
    with pytest.raises(SimStartError):
        servers.take()
    assert time.monotonic() - started < 0.4, "once the grace is over, an instance with no server errors at once"


def test_a_lost_server_is_probed_outside_the_fleets_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that swallows connections costs the probe's timeout, never the other instances' hand-overs."""
    from hud_pipelines.sim import fleet as fleet_module

    def slow_unreachable(url: str, timeout_s: float = 2.0) -> bool:
        time.sleep(0.5)
        return False

    monkeypatch.setattr(fleet_module, "reachable", slow_unreachable)
    servers = fleet_module.Fleet(["ws://a:1", "ws://b:2"])
    first, second = servers.take(), servers.take()
    servers.lose(first, f"served sim {first} stopped listening", may_return=True)
    servers.give_back(first)
    time.sleep(fleet_module.PROBE_EVERY_S)  # its probe is due
    taken: list[str] = []
    taker = threading.Thread(target=lambda: taken.append(servers.take()))
    taker.start()
    time.sleep(0.1)  # the taker is probing the lost server now
    started = time.monotonic()
    servers.give_back(second)
    assert time.monotonic() - started < 0.2, "handing a server over does not wait for a probe"
    taker.join(timeout=5)
    assert taken == [second]


def test_a_served_sim_that_says_nothing_of_itself_is_held_to_the_runs_contract(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server written elsewhere may send no identity: one that serves other observations than the run's first
    sim (a restart with other cameras, say) is refused all the same, not graded as the same sim."""
    from hud_pipelines.errors import SimStartError
    from hud_pipelines.sim import pool as pool_module
    from tests.sim.fleet_support import serve_sim

    monkeypatch.setattr(pool_module, "same_sim", lambda mine, theirs: True)  # as if neither said what it is
    served = [serve_sim("CartPole-v1"), serve_sim("Pendulum-v1")]
    try:
        settings = pool_module.SimSettings(num_envs=2, servers=tuple((url, TOKEN) for _, url in served))
        pool = pool_module.SimPool(settings)
        assert "state" in pool.contract().features
        refusals: list[str] = []
        for _ in range(2):  # each server once: the one that gave the contract serves, the other is refused
            try:
                with pool.sim() as live:
                    assert "state" in live.client.contract.features
            except SimStartError as exc:
                refusals.append(str(exc))
        pool.close()
        assert len(refusals) == 1
        assert "its contract is not the one this run's served sim announced" in refusals[0]
    finally:
        for process, _ in served:
            stop_served(process)


def test_a_server_that_does_not_answer_its_handshake_is_given_a_steps_deadline_not_half_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused server (its host frozen, SIGSTOP) accepts the TCP connection and never answers the upgrade: the
    instance errors as ``sim_start`` after ``step_timeout_s`` (at least the server's wait for a closing connection
    and a second, :data:`CLOSING_WAIT_S`), and an interrupt is not held up for 30 s."""
    monkeypatch.chdir(REPO)
    process, url = serve_cartpole()
    try:
        process.send_signal(signal.SIGSTOP)
        text = json.loads(_text([url]))
        text["sim"]["step_timeout_s"] = 1.5
        text["group"] = 1
        monkeypatch.setenv("HUD_TEST_FLEET_TOKEN", TOKEN)
        spec = load_pipeline_text(json.dumps(text), source=tmp_path / "fleet.yaml")
        evaluation = evaluate(spec, outputs_dir=tmp_path / "out")
    finally:
        process.send_signal(signal.SIGCONT)
        stop_served(process)
    assert {r.fault for r in evaluation.results} == {Fault.SIM_START}
    assert f"waited {CLOSING_WAIT_S + 1:g} s for the connection and its handshake" in (
        evaluation.results[0].error or ""
    )


def test_a_run_whose_fleet_file_reads_an_unset_variable_is_refused_before_it_starts_at_the_files_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hud_pipelines.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HUD_TEST_UNSET_FLEET_TOKEN", raising=False)
    (tmp_path / "lab.yaml").write_text("token: ${HUD_TEST_UNSET_FLEET_TOKEN}\nservers:\n  - ws://127.0.0.1:9\n")
    pipeline = tmp_path / "lab_eval.yaml"
    pipeline.write_text("name: lab_eval\nsim: {fleet: lab.yaml, num_envs: 2}\nagent: {policy: {kind: random}}\n")
    assert main(["run", str(pipeline), "--outputs", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().err
    assert "lab.yaml:1:8: token: environment variable HUD_TEST_UNSET_FLEET_TOKEN is not set" in said, said
    assert not (tmp_path / "out").exists(), "no run started"


@pytest.mark.parametrize("closed_by", ["its idle timeout", "a restart"])
def test_a_connection_closed_while_idle_in_the_pool_is_opened_anew_for_the_next_instance(closed_by: str) -> None:
    """A served sim's connection waits in the pool between instances (after the run's contract and seed check, while
    its policy loads, between a sweep's checkpoints): one its server closed meanwhile was handed to the next
    instance as it was, which errored at its first reset though the sim listened."""
    from hud_pipelines.sim.pool import SimPool
    from hud_pipelines.sim.settings import SimSettings

    process, url = serve_cartpole("--idle-timeout-s", "1")
    pool = SimPool(SimSettings(num_envs=2, servers=((url, TOKEN),)))
    try:
        with pool.sim() as live:
            live.client.reset({"seed": 0})
        if closed_by == "a restart":
            stop_served(process)
            process, again = serve_cartpole("--port", url.rsplit(":", 1)[1])
            assert again == url
        else:
            time.sleep(1.5)
        with pool.sim() as live:
            assert live.client.reset({"seed": 0}).observation["state"].shape == (2, 4)
    finally:
        pool.close(grace_s=0)
        stop_served(process)


def test_a_served_sim_that_dies_in_the_seed_check_is_named_by_what_killed_it() -> None:
    """The run's seed check resets the sim that gave the contract: where that killed its server, every instance
    said only that the server "stopped listening", and why was in a log line."""
    from hud_pipelines.errors import SimCrashedError, SimStartError
    from hud_pipelines.sim.pool import SimPool
    from hud_pipelines.sim.settings import SimSettings

    process, url = serve_cartpole()
    pool = SimPool(SimSettings(num_envs=2, servers=((url, TOKEN),)))

    def crash(_: object) -> None:
        stop_served(process)
        raise SimCrashedError(f"the sim at {url} went away during reset: the env aborted")

    try:
        pool.contract(then=crash)
        said = r"stopped listening \(the sim at .* went away during reset: the env"
        with pytest.raises(SimStartError, match=said), pool.sim():
            pass
    finally:
        pool.close(grace_s=0)
        stop_served(process)


def test_a_busy_sim_that_runs_a_gone_connections_request_is_said_so_not_another_clients() -> None:
    """A run cut short while its step hung left the server running it: the next run said "busy, driven by another
    client" and a 600 s wait, though the server's refusal said no client drives it, and for how long it had run."""
    from hud_pipelines.errors import SimRefusedError
    from hud_pipelines.sim.fleet import busy_with

    gone = SimRefusedError("busy", status=409, running_for_s=7.4)
    assert busy_with(gone, 600, 60) == (
        "is still running a request of a connection that has gone (7 s so far): waiting for it to end, or for another "
        "server; past sim.step_timeout_s = 60 s it is presumed hung"
    )
    driven = SimRefusedError("busy", status=409)
    assert busy_with(driven, 600, 60).startswith("is busy, driven by another client: waiting for it or another one")
