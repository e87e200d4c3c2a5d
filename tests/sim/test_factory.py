"""Factory specs (module:callable, file.py:callable, registry ids) and the build/episodic split."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from hud_pipelines.errors import FactoryError, TaskArgumentError
from hud_pipelines.sim.factory import FactoryKind, resolve_factory
from tests.conftest import FAULTY, POINT_MASS, REPO


def test_module_callable_spec() -> None:
    factory = resolve_factory("envs.faulty:faulty")
    assert factory.kind is FactoryKind.CALLABLE
    assert factory.name == "faulty"
    assert factory.build_params == {"fault", "at_step", "fault_seed", "delay_s"}
    assert not factory.vectorizes
    env = factory.build({"at_step": 4}, 1)
    assert env.at_step == 4


def test_file_callable_spec_and_native_vectorization() -> None:
    factory = resolve_factory(POINT_MASS)
    assert factory.kind is FactoryKind.CALLABLE
    assert factory.vectorizes
    assert factory.build_params == {"max_steps"}  # num_envs is set at start-up, never per task
    assert factory.builds_vector({}, 1)
    env = factory.build({}, 5)
    assert env.num_envs == 5


def test_a_factory_that_returns_no_env_is_refused_naming_what_it_returned(tmp_path: Path) -> None:
    source = tmp_path / "broken_factories.py"
    source.write_text("def forgot_return(tol=0.1):\n    pass\n\n\ndef a_dict():\n    return {'reset': 1}\n")
    with pytest.raises(FactoryError, match=r"returned NoneType \(a missing return\?\), not a gymnasium-style env"):
        resolve_factory(f"{source}:forgot_return").build({}, 1)
    with pytest.raises(FactoryError, match="returned dict, not a gymnasium-style env: it has no reset, step, obs"):
        resolve_factory(f"{source}:a_dict").build({}, 1)


def test_a_file_factory_imports_the_files_beside_it_and_a_missing_file_names_the_closest(tmp_path: Path) -> None:
    (tmp_path / "reach_helpers_for_factory_test.py").write_text("SPEED = 0.25\n")
    (tmp_path / "reach_factory.py").write_text(
        "import gymnasium as gym\nfrom reach_helpers_for_factory_test import SPEED\n\n\n"
        "def make():\n    env = gym.make('CartPole-v1')\n    env.speed = SPEED\n    return env\n"
    )
    env = resolve_factory(f"{tmp_path}/reach_factory.py:make").build({}, 1)
    assert env.speed == 0.25  # pyright: ignore[reportAttributeAccessIssue]
    env.close()
    with pytest.raises(FactoryError, match=r"reach_factroy.py does not exist \(did you mean 'reach_factory.py'\?\)"):
        resolve_factory(f"{tmp_path}/reach_factroy.py:make")


def test_registry_ids_and_their_build_arguments() -> None:
    factory = resolve_factory("CartPole-v1")
    assert factory.kind is FactoryKind.REGISTRY
    assert {"sutton_barto_reward", "render_mode", "max_episode_steps", "vectorization_mode"} <= factory.build_params
    assert not factory.builds_vector({}, 1)
    assert not factory.builds_vector({}, 2), "several slots: one env each, built one by one (no vector wrapper)"
    assert factory.builds_vector({"vectorization_mode": "sync"}, 1)
    single = factory.build({"max_episode_steps": 7}, 1)
    assert single.spec is not None
    assert single.spec.max_episode_steps == 7
    assert factory.vectorization_mode({}, 3) is None
    assert factory.vectorization_mode({}, 1) is None
    native = factory.build({"vectorization_mode": "vector_entry_point"}, 3)
    assert type(native).__name__ == "CartPoleVectorEnv"  # gymnasium's vector_entry_point, when asked for
    sync = factory.build({"vectorization_mode": "sync"}, 1)
    assert isinstance(sync, gym.vector.SyncVectorEnv)
    assert sync.num_envs == 1


def test_a_namespaced_registry_id_imports_its_package() -> None:
    code = (
        "import sys; from hud_pipelines.sim.factory import resolve_factory; "
        "assert 'gym_pusht' not in sys.modules; f = resolve_factory('gym_pusht/PushT-v0'); "
        "print(sorted(f.build_params & {'obs_type', 'observation_width'}), 'gym_pusht' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split("\n")[0] == "['obs_type', 'observation_width'] True"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("envs.faulty:fautly", "has no attribute 'fautly'; did you mean faulty"),
        ("envs.faulty:HANG_S", "'HANG_S' is not callable"),
        ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'"),
        ("missing/file.py:make", "file .*missing/file.py does not exist"),
        ("CartPol-v1", "unknown gymnasium registry id 'CartPol-v1'; did you mean CartPole-v1"),
        ("no_such_namespace/Env-v0", "namespace 'no_such_namespace' is not registered"),
    ],
)
def test_unresolvable_specs_name_the_culprit(spec: str, message: str) -> None:
    with pytest.raises(FactoryError, match=message):
        resolve_factory(spec)


def test_task_arguments_are_split_by_the_signature() -> None:
    factory = resolve_factory(FAULTY)
    build, episodic = factory.split_task({"seed": 3, "options": {"x": 1}, "fault": "none", "at_step": 5})
    assert build == {"fault": "none", "at_step": 5}
    assert episodic == {"seed": 3, "options": {"x": 1}}


def test_an_unknown_argument_names_the_signature_and_suggests() -> None:
    factory = resolve_factory(FAULTY)
    with pytest.raises(TaskArgumentError) as caught:
        factory.split_task({"at_stp": 3})
    message = str(caught.value)
    assert "task argument 'at_stp' is accepted neither by the factory faulty(fault: str = 'none'" in message
    assert "nor by reset(seed, options)" in message
    assert "did you mean 'at_step'?" in message
    with pytest.raises(TaskArgumentError, match="'num_envs' is set when the sim starts"):
        resolve_factory(POINT_MASS).split_task({"num_envs": 3})


def test_registry_unknown_argument_names_the_env_signature() -> None:
    with pytest.raises(TaskArgumentError, match=r"CartPole-v1\(sutton_barto_reward: bool = False"):
        resolve_factory("CartPole-v1").split_task({"gravity": 3.0})


def test_a_kwargs_factory_takes_every_non_episodic_argument(tmp_path: Path) -> None:
    module = tmp_path / "anything.py"
    module.write_text(
        "import gymnasium as gym\n"
        "def make(**kwargs):\n"
        "    env = gym.make('CartPole-v1')\n"
        "    env.kwargs = kwargs\n"
        "    return env\n"
    )
    factory = resolve_factory(f"{module}:make")
    assert factory.accepts_any
    build, episodic = factory.split_task({"anything": 1, "seed": 2})
    assert (build, episodic) == ({"anything": 1}, {"seed": 2})
    env: Any = factory.build(build, 1)
    assert env.kwargs == {"anything": 1}


def test_a_file_factory_whose_helper_module_another_pipelines_helper_replaces_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, speed in ((first, 0.25), (second, 0.5)):
        folder.mkdir()
        (folder / "shared_name_helpers_for_test.py").write_text(f"SPEED = {speed}\n")
        (folder / "factory.py").write_text(
            "import gymnasium as gym\n\n\ndef make():\n"
            "    from shared_name_helpers_for_test import SPEED\n\n"
            "    env = gym.make('CartPole-v1')\n    env.speed = SPEED\n    return env\n"
        )
    env = resolve_factory(f"{first}/factory.py:make").build({}, 1)
    assert env.speed == 0.25  # pyright: ignore[reportAttributeAccessIssue]
    env.close()
    with pytest.raises(FactoryError) as refused:  # it would build with the first folder's SPEED
        resolve_factory(f"{second}/factory.py:make")
    message = str(refused.value)
    assert f"imports 'shared_name_helpers_for_test', which is {second}/shared_name_helpers_for_test.py" in message
    assert f"resolves to {first}/shared_name_helpers_for_test.py" in message
    (second / "numpy.py").write_text("ZEROS = None\n")  # the installed numpy wins over the file
    (second / "uses_numpy.py").write_text("import numpy\n\n\ndef make():\n    return numpy\n")
    with pytest.raises(
        FactoryError, match=r"imports 'numpy', which is .*second/numpy.py beside it, but 'numpy' resolves"
    ):
        resolve_factory(f"{second}/uses_numpy.py:make")
