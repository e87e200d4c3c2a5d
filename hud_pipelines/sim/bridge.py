"""GymBridge: N slots of a gymnasium-style sim, stepped in lockstep, batched first.

The bridge is the sim-side core. It builds the envs from a factory, derives (and resolves) the
contract, and turns batched requests into batched replies:

- ``reset(tasks)`` takes one task per slot (``seed``, ``options`` and build arguments) and starts
  every slot together; a changed build argument rebuilds the envs first;
- ``step(action)`` takes one ``[N, A]`` frame; finished slots get the hold action and nothing that
  happens to them afterwards reaches their episode;
- ``result()`` grades every slot.

It does no I/O and no threading: the server calls it on the sim's main thread, and tests and the
in-process baseline call it directly.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hud_pipelines.contract import (
    Contract,
    control_rate_of,
    derive_contract,
    flatten_observation,
    merge_contract,
    resolve_contract,
)
from hud_pipelines.errors import HudPipelinesError, TaskArgumentError
from hud_pipelines.sim.actions import ActionAdapter, BoundsMode, HoldMode
from hud_pipelines.sim.envs import ObservationBuffer, ReplicatedEnvs, SlotEnvs, VectorEnvs
from hud_pipelines.sim.factory import Factory, FactoryKind, resolve_factory
from hud_pipelines.sim.slots import SlotBatch
from hud_pipelines.wire.messages import Observation, Phase, SlotError

log = logging.getLogger(__name__)


class EnvFault(HudPipelinesError):
    """The env's own code raised; the affected episodes are already marked errored."""

    def __init__(self, phase: Phase, message: str, *, slot: int | None, formatted: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.slot = slot
        self.formatted = formatted


class GymBridge:
    """Serve ``num_envs`` slots of the env that ``factory`` builds."""

    def __init__(
        self,
        factory: Factory | str,
        num_envs: int = 1,
        *,
        build_args: Mapping[str, Any] | None = None,
        contract_path: Path | None = None,
        hold: HoldMode = HoldMode.LAST,
        bounds: BoundsMode = BoundsMode.CLIP,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.factory = resolve_factory(factory) if isinstance(factory, str) else factory
        self.num_envs = num_envs
        self.contract_path = contract_path
        self.hold = hold
        self.bounds = bounds
        self.slots = SlotBatch(num_envs)
        self._build_args: dict[str, Any] = dict(build_args or {})
        self.factory.split_task(self._build_args)  # refuse unknown build arguments before building
        self._envs: SlotEnvs | None = None
        self._contract: Contract | None = None
        self._names: dict[str, str] = {}
        self._obs: ObservationBuffer = {}
        self._actions: ActionAdapter | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def contract(self) -> Contract:
        if self._contract is None:
            raise RuntimeError("the bridge has not started; call start() first")
        return self._contract

    @property
    def vectorized(self) -> bool:
        return isinstance(self._envs, VectorEnvs)

    def start(self) -> Contract:
        """Build the envs and derive the contract (resolved against ``contract_path``)."""
        self._build(self._build_args)
        return self.contract

    def close(self) -> None:
        if self._envs is not None:
            envs, self._envs = self._envs, None
            envs.close()

    def __enter__(self) -> GymBridge:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self, build_args: dict[str, Any]) -> None:
        self.close()
        built = self.factory.build(build_args, self.num_envs)
        native = self.factory.vectorizes or (self.factory.kind is FactoryKind.REGISTRY and self.num_envs > 1)
        if native:
            envs: SlotEnvs = VectorEnvs(built)
            if envs.num_slots != self.num_envs:
                raise TaskArgumentError(
                    f"factory {self.factory.name} was asked for num_envs={self.num_envs} but built {envs.num_slots} slots"
                )
        else:
            envs = ReplicatedEnvs([built, *(self.factory.build(build_args, 1) for _ in range(self.num_envs - 1))])
        self._envs = envs
        sample, _ = envs.sample_observation()
        robot_type = str(envs.metadata.get("robot_type") or self.factory.name)
        derived = derive_contract(
            envs.single_observation_space,
            envs.single_action_space,
            sample,
            control_rate=control_rate_of(envs),
            robot_type=robot_type,
        )
        if self._contract is None:
            self._contract = resolve_contract(derived, self.contract_path)
        else:  # a rebuild with other build args must still honour the contract the clients saw
            merge_contract(self._contract, derived, source=f"the env rebuilt with {build_args}")
        self._names = {name: name or next(iter(derived.observation_features)) for name in flatten_observation(sample)}
        envs.contract = self._contract  # pyright: ignore[reportAttributeAccessIssue]
        self._obs = {
            k: np.zeros((self.num_envs, *f.shape), dtype=f.dtype)
            for k, f in self._contract.observation_features.items()
        }
        self._actions = ActionAdapter(
            self._contract.action, envs.single_action_space, self.num_envs, hold=self.hold, bounds=self.bounds
        )
        self._build_args = build_args

    # -- requests ----------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]], seq: int = 0) -> Observation:
        """Start a new episode in every slot; ``tasks`` has one dict per slot."""
        if len(tasks) != self.num_envs:
            raise TaskArgumentError(f"reset needs one task per slot: {self.num_envs} slots, {len(tasks)} tasks")
        split = [self.factory.split_task(task) for task in tasks]
        build_args = split[0][0]
        for slot, (slot_build, _) in enumerate(split):
            if slot_build != build_args:
                raise TaskArgumentError(
                    f"slot {slot} asks for build arguments {slot_build}, slot 0 for {build_args}: the slots of one "
                    "sim share one build"
                )
        if build_args and build_args != {k: self._build_args.get(k) for k in build_args}:
            log.info("rebuilding %s with %s", self.factory.name, build_args)
            self._build({**self._build_args, **build_args})
        seeds = [_seed(episodic.get("seed"), slot) for slot, (_, episodic) in enumerate(split)]
        options = [episodic.get("options") for _, episodic in split]
        self.slots.begin(seeds)
        envs = self._require_envs()
        try:
            offered = envs.reset(seeds, options, self._obs, self._names)
        except HudPipelinesError:
            self.slots.fail_running("reset refused")
            raise
        except Exception as exc:
            self.slots.fail_running(f"env.reset raised {type(exc).__name__}: {exc}")
            raise EnvFault(
                Phase.RESET,
                f"env.reset raised {type(exc).__name__}: {exc}",
                slot=None,
                formatted=traceback.format_exc(),
            ) from exc
        assert self._actions is not None
        self._actions.restart()
        prompts = [own or self._prompt(task) for own, task in zip(offered, tasks, strict=True)]
        return self._observation(seq, np.zeros(self.num_envs), prompts=prompts)

    def step(self, action: object, seq: int = 0) -> Observation:
        """Apply one ``[N, A]`` action frame to every running slot."""
        self.slots.require_running()
        envs = self._require_envs()
        assert self._actions is not None
        running = self.slots.running()
        rows = self._actions.validate(action, running)
        try:
            tick = envs.step(self._actions.to_env(rows, batched=self.vectorized), running, self._obs, self._names)
        except HudPipelinesError:
            self.slots.fail_running("step refused")
            raise
        except Exception as exc:
            self.slots.fail_running(f"env.step raised {type(exc).__name__}: {exc}")
            raise EnvFault(
                Phase.STEP, f"env.step raised {type(exc).__name__}: {exc}", slot=None, formatted=traceback.format_exc()
            ) from exc
        for slot, formatted in tick.errors.items():
            self.slots.fail(slot, formatted.strip().splitlines()[-1])
        stepped = running.copy()
        stepped[list(tick.errors)] = False
        self.slots.record_step(tick.reward, tick.terminated, tick.truncated, tick.success)
        if tick.errors and not stepped.any():
            slot, formatted = next(iter(tick.errors.items()))
            raise EnvFault(
                Phase.STEP,
                formatted.strip().splitlines()[-1],
                slot=slot if len(tick.errors) == 1 else None,
                formatted=formatted,
            )
        reward = np.where(stepped, tick.reward, 0.0)
        errors = [SlotError(slot=s, message=f.strip().splitlines()[-1], traceback=f) for s, f in tick.errors.items()]
        return self._observation(seq, reward, errors=errors)

    def result(self) -> dict[str, Any]:
        """``{score, success, slots}`` of the current episodes."""
        return self.slots.result()

    def abort(self, reason: str) -> list[int]:
        """End every running episode as errored (e.g. the client went away)."""
        return self.slots.fail_running(reason)

    # -- helpers -----------------------------------------------------------------------------------

    def _require_envs(self) -> SlotEnvs:
        if self._envs is None:
            raise RuntimeError("the bridge has not started; call start() first")
        return self._envs

    def _prompt(self, task: Mapping[str, Any]) -> str:
        described = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in sorted(task.items()) if k != "seed")
        return f"{self.factory.name} {described}".strip()

    def _observation(
        self, seq: int, reward: Any, *, prompts: list[str] | None = None, errors: list[SlotError] | None = None
    ) -> Observation:
        records = self.slots.records
        return Observation(
            seq=seq,
            observation={k: v.copy() for k, v in self._obs.items()},
            reward=np.asarray(reward, dtype=np.float64),
            terminated=np.array([r.terminated for r in records], dtype=np.bool_),
            truncated=np.array([r.truncated for r in records], dtype=np.bool_),
            success=np.array([r.success for r in records], dtype=np.bool_),
            status=[r.state.value for r in records],
            prompt=prompts,
            errors=errors or [],
        )


def _seed(value: object, slot: int) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TaskArgumentError(f"slot {slot}: seed must be an integer or null, got {value!r}")
