"""Served sims: a spawned child, the wire, the client; the same trajectories as in-process.

Each env kind of ``test_bridge.py`` is served from a child process, N = 1 with scalar framing and
N > 1 with batched framing, and driven with the same seeds and actions as a plain gymnasium loop:
the observations must be bit-identical. Then the process shape itself: one JSON ready line on
stdout, sim touches on the main thread, no torch/lerobot/dagster in the child, ``--arg`` build
arguments, the contract file, attach, tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from hud_pipelines.contract import Feature
from hud_pipelines.errors import RemoteError, SimError, SimRefusedError, SimStartError
from hud_pipelines.sim.process import SimProcess
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import PROTOCOL_VERSION, Framing
from tests.conftest import FAULTY, PROBE, REPO, action_frames, assert_same_trajectory, driven, wait_group_gone
from tests.seeding import FIRST, SEEDS, assert_honest_seeds
from tests.sim.test_bridge import CASES, Case

Spawn = Callable[..., SimProcess]


def action_space(feature: Feature) -> gym.Space[Any]:
    """The single-env action space a client can rebuild from the contract alone."""
    low = np.asarray(feature.low if feature.low is not None else [-1.0] * feature.size)
    high = np.asarray(feature.high if feature.high is not None else [1.0] * feature.size)
    if np.dtype(feature.dtype).kind == "i":
        return gym.spaces.Discrete(int(high[0] - low[0]) + 1, start=int(low[0]))
    return gym.spaces.Box(low.astype(feature.dtype), high.astype(feature.dtype), dtype=np.dtype(feature.dtype))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_served_trajectories_are_bit_identical_to_plain_gymnasium(case: Case, spawn: Spawn) -> None:
    sim = spawn(case.factory, num_envs=case.num_envs, build_args=case.build_args)
    framing = None if case.num_envs == 1 else Framing.BATCHED  # the sim picks scalar framing for one env
    with sim.connect(framing=framing) as client:
        assert client.framing is (Framing.SCALAR if case.num_envs == 1 else Framing.BATCHED)
        assert client.num_envs == case.num_envs
        frames = action_frames(action_space(client.contract.action), case.num_envs, case.steps)
        actual = driven(client.reset, client.step, [{"seed": s} for s in case.seeds()], frames)
        for array in client.reset([{"seed": 0}] * case.num_envs).observation.values():
            assert array.flags.writeable
            assert array.dtype.isnative
            assert array.shape[0] == case.num_envs
    assert_same_trajectory(actual, case.expected(frames))


def test_a_replicated_callable_served_equals_in_process(spawn: Spawn, tmp_path: Path) -> None:
    from hud_pipelines.sim.bridge import GymBridge

    module = tmp_path / "pendulums.py"
    module.write_text(
        "import gymnasium as gym\ndef make():\n    return gym.make('Pendulum-v1', max_episode_steps=15)\n"
    )
    tasks = [{"seed": s} for s in (3, 4, 5)]
    with GymBridge(f"{module}:make", 3) as bridge:
        frames = action_frames(bridge.envs.single_action_space, 3, 20)
        in_process = driven(bridge.reset, bridge.step, tasks, frames)
    sim = spawn(f"{module}:make", num_envs=3)
    with sim.connect() as client:
        served = driven(client.reset, client.step, tasks, frames)
    assert_same_trajectory(served, in_process)


def test_served_registry_slots_get_the_seeds_they_are_credited_with(spawn: Spawn) -> None:
    with spawn("CartPole-v1", num_envs=4).connect() as client:  # as `hud-pipelines serve CartPole-v1 --num-envs 4`
        first = client.reset([{"seed": s} for s in FIRST]).observation["state"]
        second = client.reset([{"seed": s} for s in SEEDS]).observation["state"]
        credited = [slot["seed"] for slot in client.result().slots]
    assert_honest_seeds(first, second, credited)
    native = spawn("CartPole-v1", num_envs=2, build_args={"vectorization_mode": "vector_entry_point"})
    with native.connect() as client:
        with pytest.raises(RemoteError, match=r"takes one seed for all 2 slots.*slot\(s\) \[1\]") as caught:
            client.reset([{"seed": 1}, {"seed": 2}])
        assert caught.value.phase == "reset"
        assert [slot["seed"] for slot in client.result().slots] == [None, None]  # nothing was credited
        client.reset([{"seed": 1}, {"seed": 1}])
        assert [slot["seed"] for slot in client.result().slots] == [1, 1]


def test_served_bad_action_rows_and_non_finite_observations_error_their_slot_only(spawn: Spawn) -> None:
    sim = spawn(FAULTY, num_envs=3, build_args={"fault": "nan_step", "at_step": 2, "fault_seed": 12})
    with sim.connect() as client:
        client.reset([{"seed": 10}, {"seed": 11}, {"seed": 12}])
        reply = client.step(np.array([[0.5], [np.nan], [0.25]], np.float32))
        assert reply.status == ["running", "errored", "running"]
        assert [e.slot for e in reply.errors] == [1]
        assert reply.errors[0].message.startswith("action [nan] is not finite (seed 11, step 1); expected a finite")
        assert reply.observation["state"][[0, 2]].tolist() == [[1.0, 0.5, 10.0], [1.0, 0.25, 12.0]]
        reply = client.step(np.zeros((3, 1), np.float32))
        assert reply.status == ["running", "errored", "errored"]
        assert [(e.slot, e.message) for e in reply.errors] == [
            (2, "observation 'state' is not finite (seed 12, step 2)")
        ]
        assert client.step(np.zeros((3, 1), np.float32)).observation["state"][0, 0] == 3.0
        slots = client.result().slots
    assert [s["status"] for s in slots] == ["running", "errored", "errored"]
    assert [s["steps"] for s in slots] == [3, 0, 1]


# ---------------------------------------------------------------------------------------------
# the wire as another language would see it


@pytest.fixture(scope="module")
def probe_sim() -> Iterator[SimProcess]:
    sim = SimProcess.spawn(PROBE, build_args={"success_key": "is_success"})
    yield sim
    sim.close()
    assert sim.pgid is not None
    wait_group_gone(sim.pgid)


def raw_connect(sim: SimProcess) -> ClientConnection:
    return connect(sim.url, additional_headers={"Authorization": f"Bearer {sim.token}"}, compression=None)


def test_scalar_framing_on_the_wire(probe_sim: SimProcess) -> None:
    with raw_connect(probe_sim) as ws:
        ws.send(packb({"type": "hello", "protocol": PROTOCOL_VERSION}))
        hello = unpackb(ws.recv(timeout=10))
        assert hello["type"] == "hello"
        assert (hello["protocol"], hello["framing"], hello["num_envs"]) == (PROTOCOL_VERSION, "scalar", 1)
        assert (hello["hold"], hello["bounds"]) == ("last", "clip")
        assert hello["server"].startswith("hud-pipelines/")
        assert hello["contract"]["features"]["action"]["dtype"] == "int64"
        assert hello["max_frame_bytes"] > 0
        ws.send(packb({"type": "reset", "seq": 1, "task": {"seed": 4}}))
        reset = unpackb(ws.recv(timeout=10))
        assert reset["observation"]["state"].shape == (4,)
        assert (reset["status"], reset["prompt"], reset["errors"]) == ("running", "probe", [])
        ws.send(packb({"type": "step", "seq": 2, "action": np.array([2], dtype=np.int64)}))
        step = unpackb(ws.recv(timeout=10))
        assert step["type"] == "observation"
        assert step["seq"] == 2
        assert step["observation"]["state"].shape == (4,)
        assert step["reward"] == 2.0
        assert type(step["terminated"]) is bool
        assert type(step["success"]) is bool
        ws.send(packb({"type": "result", "seq": 3}))
        result = unpackb(ws.recv(timeout=10))
        assert result["type"] == "result"
        assert result["slots"][0]["steps"] == 1
        ws.send(packb({"type": "close"}))
        assert unpackb(ws.recv(timeout=10)) == {"type": "close"}


def test_scalar_actions_and_their_errors_speak_scalar_framing(probe_sim: SimProcess) -> None:
    with raw_connect(probe_sim) as ws:
        ws.send(packb({"type": "hello", "protocol": PROTOCOL_VERSION}))
        assert unpackb(ws.recv(timeout=10))["framing"] == "scalar"
        ws.send(packb({"type": "reset", "seq": 1, "task": {"seed": 4}}))
        assert unpackb(ws.recv(timeout=10))["type"] == "observation"
        ws.send(packb({"type": "step", "seq": 2, "action": np.array(2, dtype=np.int64)}))  # shape [] for A = 1
        step = unpackb(ws.recv(timeout=10))
        assert (step["type"], step["reward"], step["status"]) == ("observation", 2.0, "running")
        ws.send(packb({"type": "step", "seq": 3, "action": np.array([0, 1, 0], dtype=np.int64)}))
        error = unpackb(ws.recv(timeout=10))
        assert (error["type"], error["phase"], error["seq"]) == ("error", "step", 3)
        assert error["message"] == "action has shape [3], expected int64[A=1] (names ['action_0'])"
        ws.send(packb({"type": "step", "seq": 4, "action": np.array([[1]], dtype=np.int64)}))
        error = unpackb(ws.recv(timeout=10))
        assert error["message"] == "action has shape [1, 1], expected int64[A=1] (names ['action_0'])"


def test_the_token_may_travel_as_a_query_parameter_and_is_required(probe_sim: SimProcess) -> None:
    with connect(f"{probe_sim.url}/?token={probe_sim.token}", compression=None) as ws:
        ws.send(packb({"type": "hello", "protocol": PROTOCOL_VERSION}))
        assert unpackb(ws.recv(timeout=10))["type"] == "hello"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {probe_sim.token}"}):
        with pytest.raises(InvalidStatus) as caught, connect(probe_sim.url, additional_headers=headers):
            pass
        assert caught.value.response.status_code == 401


def test_sim_touches_run_on_the_main_thread_and_the_idle_hook_runs_between(probe_sim: SimProcess) -> None:
    with probe_sim.connect(framing=None) as client:
        reply = client.reset({"seed": 0})
        _, on_main, idle_before, built_on_main = reply.observation["state"][0]
        assert (on_main, built_on_main) == (1.0, 1.0)
        time.sleep(0.3)
        _t, on_main, idle_after, _ = client.step([1]).observation["state"][0]
        assert on_main == 1.0
        assert idle_after > idle_before + 5  # pumped every ~10 ms while no request came


def test_success_and_result_over_the_wire(probe_sim: SimProcess) -> None:
    with probe_sim.connect() as client:
        client.reset({"seed": 1})
        replies = [client.step(np.array([[1]])) for _ in range(4)]
        result = client.result()
    assert [bool(r.success[0]) for r in replies] == [False, False, True, True]
    assert (result.score, result.success) == (1.0, True)
    slot = result.slots[0]
    assert {"score", "success", "total_reward", "steps", "terminated", "truncated", "status"} <= set(slot)
    assert (slot["steps"], slot["total_reward"], slot["status"]) == (4, 4.0, "running")


def test_pipelined_steps_are_answered_in_order_and_kept_for_their_callers(probe_sim: SimProcess) -> None:
    with probe_sim.connect() as client:
        client.reset({"seed": 1})
        first = client.send_step(np.array([[1]]))
        second = client.send_step(np.array([[1]]))
        result = client.result()  # answered after both steps; their replies wait for their callers
        assert client.in_flight == 2
        later = client.receive_step(second)
        earlier = client.receive_step(first)
        with pytest.raises(SimError, match=f"no request numbered {first} is waiting"):
            client.receive_step(first)
        assert client.usable
        assert client.step(np.array([[1]])).seq > result.seq
    assert (earlier.seq, later.seq) == (first, second)
    assert result.seq > second
    assert result.slots[0]["steps"] == 2
    assert [bool(earlier.success[0]), bool(later.success[0])] == [False, False]


def test_one_connection_drives_the_sim_a_second_is_refused_until_it_leaves(probe_sim: SimProcess) -> None:
    with probe_sim.connect() as first:
        with pytest.raises(SimRefusedError, match="HTTP 409") as caught:
            probe_sim.connect()
        assert caught.value.status == 409
        first.reset()
    with probe_sim.connect() as second:
        assert second.reset().status == ["running"]


def test_task_arguments_over_the_wire(spawn: Spawn) -> None:
    sim = spawn("CartPole-v1")
    with sim.connect() as client:
        reply = client.reset({"seed": 0, "max_episode_steps": 2})
        client.step([[0]])
        assert client.step([[1]]).truncated.tolist() == [True]
        with pytest.raises(RemoteError, match=r"'gravity' is accepted neither by the factory CartPole-v1\(") as caught:
            client.reset({"gravity": 3.0})
        assert caught.value.phase == "reset"
        assert client.reset({"seed": 0}).status == ["running"]  # still serving
    assert reply.prompt == ["CartPole-v1 max_episode_steps=2"]


def test_attach_gives_the_same_client_and_does_not_own_the_sim(probe_sim: SimProcess) -> None:
    attached = SimProcess.attach(probe_sim.url, probe_sim.token)
    assert attached.pid is None
    assert not attached.owned
    assert attached.alive()
    with attached.connect() as client:
        assert client.reset({"seed": 2}).status == ["running"]
    attached.close()
    assert probe_sim.alive()


# ---------------------------------------------------------------------------------------------
# the child process itself


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hud_pipelines.sim", *args]


def read_ready(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    return json.loads(line)


@pytest.mark.parametrize("entry", ["module", "console-script"])
def test_exactly_one_json_line_reaches_stdout_whatever_the_env_prints(entry: str) -> None:
    factory = f"{REPO / 'envs' / 'faulty.py'}:faulty"
    args = [factory, "--arg", "fault=print", "--arg", "at_step=1"]
    command = (
        serve_command(*args)
        if entry == "module"
        else [str(Path(sys.executable).parent / "hud-pipelines"), "serve", *args]
    )
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        ready = read_ready(process)
        assert {"url", "token", "protocol"} <= set(ready)
        assert ready["protocol"] == PROTOCOL_VERSION
        assert ready["url"].startswith("ws://127.0.0.1:")
        assert "local_socket" not in ready  # only asked for (``--local-socket``, as a spawning parent does)
        with SimProcess.attach(ready["url"], ready["token"]).connect() as client:
            client.reset({"seed": 0})
            client.step([[0.5]])
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=20)
    finally:
        os.killpg(process.pid, signal.SIGKILL) if process.poll() is None else None
    assert stdout == b""  # nothing after the ready line, although the env printed on build, reset and step
    assert process.returncode == 0
    text = stderr.decode()
    assert "FaultyEnv is building" in text
    assert "FaultyEnv is stepping" in text
    assert "shutting down" in text


def test_a_server_run_by_hand_says_its_first_sigterm_waits_for_a_hung_step() -> None:
    """The first signal waits for the sim's current call, which a hung step never ends: a server started by
    hand says so and how to interrupt it (it seemed to ignore the signal); the second one ends it."""
    from hud_pipelines.sim.serve import STOPPING_NOTICE

    factory = f"{REPO / 'envs' / 'faulty.py'}:faulty"
    process = subprocess.Popen(
        serve_command(factory, "--arg", "fault=hang_step", "--arg", "at_step=1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        ready = read_ready(process)
        client = SimProcess.attach(ready["url"], ready["token"]).connect(step_timeout_s=60)
        client.reset({"seed": 0})

        def step() -> None:
            with contextlib.suppress(SimError):  # answered with an error once the second signal interrupts it
                client.step([[0.0]])

        threading.Thread(target=step, daemon=True).start()
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert process.poll() is None, "the step in flight is not torn apart"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
        client.close()
    finally:
        os.killpg(process.pid, signal.SIGKILL) if process.poll() is None else None
    assert STOPPING_NOTICE.decode().strip() in stderr.decode()


@pytest.mark.parametrize("given", ["flag", "environment"])
def test_an_empty_token_is_refused_not_replaced_by_a_random_one(given: str) -> None:
    from hud_pipelines.sim.serve import TOKEN_ENV

    args = ["CartPole-v1", *(["--token", ""] if given == "flag" else [])]
    env = {**os.environ, TOKEN_ENV: "" if given == "environment" else "unused"}
    done = subprocess.run(serve_command(*args), capture_output=True, env=env, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == b"", "no ready line: nothing was served"
    where = "--token" if given == "flag" else f"${TOKEN_ENV}"
    assert f"{where} is empty: give a token, or leave it out for a random one" in done.stderr.decode()


def test_the_child_imports_no_torch_lerobot_or_dagster(spawn: Spawn, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "atexit.register(lambda: open(os.environ['HUD_TEST_MODULES'], 'w').write('\\n'.join(sorted(sys.modules))))\n"
    )
    listing = tmp_path / "modules.txt"
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    sim = spawn("CartPole-v1", num_envs=2, env={"PYTHONPATH": path, "HUD_TEST_MODULES": str(listing)})
    with sim.connect() as client:
        client.reset()
        client.step(np.zeros((2, 1)))
    sim.close()
    modules = {name.split(".")[0] for name in listing.read_text().split()}
    assert {"gymnasium", "websockets", "msgpack", "hud_pipelines"} <= modules  # the listing is real
    assert not modules & {"torch", "lerobot", "dagster", "transformers"}


def test_build_arguments_from_the_command_line(spawn: Spawn) -> None:
    sim = spawn("CartPole-v1", options=["--arg", "max_episode_steps=3", "--arg", "sutton_barto_reward=true"])
    with sim.connect() as client:
        client.reset({"seed": 0})
        replies = [client.step([[k % 2]]) for k in range(3)]
    assert replies[-1].truncated.tolist() == [True]
    assert [r.reward[0] for r in replies] == [0.0, 0.0, 0.0]  # Sutton and Barto reward: 0 while alive


def test_an_unknown_build_argument_fails_start_up_naming_the_signature(spawn: Spawn) -> None:
    started = time.monotonic()
    with pytest.raises(SimStartError) as caught:
        spawn(FAULTY, build_args={"speed": 3})
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert "exited with code 2 before it was ready" in message
    assert "task argument 'speed' is accepted neither by the factory faulty(fault: str = 'none'" in message


def test_the_contract_file_is_written_where_asked_and_edits_survive_a_restart(spawn: Spawn, tmp_path: Path) -> None:
    path = tmp_path / "pipelines" / "cartpole.contract.json"
    sim = spawn("CartPole-v1", contract_path=path)
    with sim.connect() as client:
        assert client.contract.features["state"].names == ["state_0", "state_1", "state_2", "state_3"]
    sim.close()
    raw = json.loads(path.read_text())
    raw["features"]["state"]["names"] = ["x", "x_dot", "theta", "theta_dot"]
    raw["robot_type"] = "cart_pole"
    path.write_text(json.dumps(raw))
    sim = spawn("CartPole-v1", contract_path=path)
    with sim.connect() as client:
        assert client.contract.features["state"].names == ["x", "x_dot", "theta", "theta_dot"]
        assert client.contract.robot_type == "cart_pole"
    sim.close()
    raw["features"]["state"]["shape"] = [6]
    raw["features"]["state"]["names"] = [f"s{i}" for i in range(6)]
    path.write_text(json.dumps(raw))
    with pytest.raises(SimStartError) as caught:
        spawn("CartPole-v1", contract_path=path)
    message = str(caught.value)
    assert str(path) in message
    assert "'state' is observation float32[6] in the contract file" in message
    assert "float32[4] in the env" in message


def test_no_contract_file_lands_in_the_working_directory(spawn: Spawn, tmp_path: Path) -> None:
    sim = spawn("CartPole-v1", cwd=tmp_path)
    with sim.connect() as client:
        client.reset()
    sim.close()
    assert list(tmp_path.iterdir()) == []


def test_the_server_never_negotiates_compression(probe_sim: SimProcess) -> None:
    with connect(probe_sim.url, additional_headers={"Authorization": f"Bearer {probe_sim.token}"}) as ws:
        assert ws.response is not None
        assert ws.response.headers.get("Sec-WebSocket-Extensions") is None  # the client offered permessage-deflate


def test_a_served_sim_whose_reset_needs_options_takes_them_for_its_probe_and_says_so_without(spawn: Spawn) -> None:
    """``hud-pipelines serve --probe-seed --probe-options``: what a pipeline gives the children it spawns."""
    factory = f"{Path(__file__).with_name('probe_sims.py')}:needs_options"
    sim = spawn(factory, options=("--probe-seed", "2", "--probe-options", '{"difficulty": 0.5}'))
    with sim.connect() as client:
        assert client.contract.observation_features["state"].shape == (2,)
    with pytest.raises(SimStartError) as caught:
        spawn(factory, options=("--probe-seed", "2"))
    assert caught.value.child_error is not None
    assert caught.value.child_error.startswith(
        "EnvFault: the probe reset at start-up, env.reset(seed=2, options=None), which samples one observation to "
        "derive the contract, raised KeyError: \"reset needs options['difficulty']\""
    )
    source = Path(factory.partition(":")[0]).read_text().splitlines()
    line = next(number for number, text in enumerate(source, 1) if "raise KeyError" in text)
    assert caught.value.child_error.endswith(f"probe_sims.py:{line} in reset)"), "the env's line, from its traceback"
    refused = subprocess.run(
        serve_command(factory, "--probe-options", "[1]"), capture_output=True, timeout=60, check=False
    )
    assert refused.returncode == 2
    assert "--probe-options: expected a JSON object, got '[1]'" in refused.stderr.decode()
