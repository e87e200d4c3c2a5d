"""What a sim says it is: the same sim checked out under two paths is one sim; other arguments are another."""

from __future__ import annotations

from pathlib import Path

from hud_pipelines.sim.identity import describe, factory_name, same_sim, sim_identity


def test_a_sim_is_its_factory_arguments_and_packages_not_where_its_file_or_interpreter_lies() -> None:
    here = sim_identity("/home/a/project/envs/reach.py:make", {"length": 40})
    there = {**sim_identity("/srv/checkout/envs/reach.py:make", {"length": 40}), "python": "/opt/venv/bin/python"}
    assert factory_name("/home/a/project/envs/reach.py:make") == "reach.py:make"
    assert same_sim(here, there)
    assert not same_sim(here, sim_identity("/home/a/project/envs/reach.py:make", {"length": 5}))
    assert not same_sim(here, {**here, "packages": {**here["packages"], "numpy": "0.0.1"}})
    assert describe(here).startswith('reach.py:make with {"length": 40} (gymnasium ')


def test_the_factorys_own_package_is_recorded_for_a_module_and_for_a_registry_namespace() -> None:
    assert "gymnasium" in sim_identity("gymnasium.envs.classic_control:CartPoleEnv", {})["packages"]
    assert "gym_pusht" in sim_identity("gym_pusht/PushT-v0", {})["packages"]
    assert set(sim_identity("CartPole-v1", {})["packages"]) == {"gymnasium", "mujoco", "numpy"}


def test_a_sims_code_is_part_of_it_wherever_its_checkout_lies(tmp_path: Path) -> None:
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        (tmp_path / checkout / "reach.py").write_text("import helpers\n\ndef make(): ...\n")
        (tmp_path / checkout / "helpers.py").write_text("GAIN = 1.0\n")
    one = sim_identity(f"{tmp_path}/a/reach.py:make", {})
    assert set(one["sources"]) == {"reach.py", "helpers.py"}, "the factory's file and the module beside it"
    assert same_sim(one, sim_identity(f"{tmp_path}/b/reach.py:make", {}))
    (tmp_path / "b" / "helpers.py").write_text("GAIN = 2.0\n")
    edited = sim_identity(f"{tmp_path}/b/reach.py:make", {"edited": True})  # another cache entry: read anew
    assert not same_sim({**one, "args": {"edited": True}}, edited)
    earlier_server = {key: value for key, value in one.items() if key != "sources"}
    assert same_sim(earlier_server, edited | {"args": {}}), "a server that sends no digests is compared on the rest"
    assert sim_identity("CartPole-v1", {})["sources"] == {}, "a registry id names no file"
