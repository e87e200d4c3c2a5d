"""GymBridge: N slots of a gymnasium-style sim, stepped in lockstep, batched first.

The bridge is the sim-side core. It builds the envs from a factory, derives (and resolves) the
contract, and turns batched requests into batched replies:

- ``reset(tasks)`` takes one task per slot (``seed``, ``options`` and build arguments) and starts
  every slot together; a changed build argument rebuilds the envs first;
- ``step(action)`` takes one ``[N, A]`` frame; finished slots get the hold action and nothing that
  happens to them afterwards reaches their episode;
- ``result()`` grades every slot.

What a slot is credited with is what it got: its seed is the one its env was reset with (a vector
env that takes one seed for the batch refuses distinct per-slot seeds), and a slot whose action row
is refused, or whose observation or reward is NaN or infinite, ends as *errored* at once, with the
reason, while the other slots go on.

Build arguments belong to one connection: the operator's (``build_args``) are the base, a
connection's resets add their own on top, and :meth:`begin_connection` drops them again, so what one
client asked for never reaches the next. A registry id's ``vectorization_mode`` is the operator's
alone.

It does no I/O and no threading: the server calls it on the sim's main thread, and tests and the
in-process baseline call it directly.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import (
    Contract,
    control_rate_of,
    derive_contract,
    flatten_observation,
    merge_contract,
    resolve_contract,
)
from hud_pipelines.errors import EnvFault, HudPipelinesError, TaskArgumentError
from hud_pipelines.sim.actions import ActionAdapter, BoundsMode, HoldMode
from hud_pipelines.sim.envs import ObservationBuffer, ReplicatedEnvs, SlotEnvs, VectorEnvs
from hud_pipelines.sim.factory import VECTORIZATION_MODE, Factory, FactoryKind, resolve_factory
from hud_pipelines.sim.slots import SlotBatch
from hud_pipelines.wire.messages import Observation, Phase, SlotError

log = logging.getLogger(__name__)


class GymBridge:
    """Serve ``num_envs`` slots of the env that ``factory`` builds.

    ``hold`` is what a finished slot receives while the others keep stepping; ``bounds`` says what
    happens to continuous actions outside the contract's bounds (see :mod:`hud_pipelines.sim.actions`).
    """

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
        self._operator_args: dict[str, Any] = dict(build_args or {})
        """The build arguments the sim was started with: every connection starts from these."""
        self._build_args: dict[str, Any] = dict(self._operator_args)
        self.factory.split_task(self._build_args)  # refuse unknown build arguments before building
        self._envs: SlotEnvs | None = None
        self._contract: Contract | None = None
        self._obs: ObservationBuffer = {}
        self._float_features: list[str] = []
        self._actions: ActionAdapter | None = None
        self._rebuild = False
        """Set after the env itself raised in a vector env: the next reset builds it afresh."""

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def contract(self) -> Contract:
        if self._contract is None:
            raise RuntimeError("the bridge has not started; call start() first")
        return self._contract

    @property
    def vectorized(self) -> bool:
        """Whether one vector env serves all slots (else one env per slot)."""
        return isinstance(self._envs, VectorEnvs)

    @property
    def envs(self) -> SlotEnvs:
        """The envs behind the slots (:class:`ReplicatedEnvs` or :class:`VectorEnvs`), for inspection."""
        return self._require_envs()

    @property
    def build_args(self) -> dict[str, Any]:
        """The build arguments of the envs built now."""
        return dict(self._build_args)

    def begin_connection(self) -> None:
        """A new client: forget the previous one's build arguments and episodes.

        Its slot records (and episode counters) start afresh, so its ``result`` shows only its own
        episodes; its first reset rebuilds the env back to the operator's arguments if an earlier
        connection changed them.
        """
        self.slots = SlotBatch(self.num_envs)

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

    def idle_hook(self) -> Callable[[], None] | None:
        """The env's ``idle_hook`` method, if it has one (the server runs it between requests)."""
        return None if self._envs is None else self._envs.idle_hook()

    def run_idle_hook(self) -> None:
        """Run the idle hook of the envs built *now* (a rebuild replaces the env that offered it)."""
        hook = self.idle_hook()
        if hook is not None:
            hook()

    def _build(self, build_args: dict[str, Any]) -> None:
        """(Re)build the envs; on any failure no envs are left half-built."""
        self.close()
        built: list[Any] = []
        try:
            if self.factory.builds_vector(build_args, self.num_envs):
                built.append(self.factory.build(build_args, self.num_envs))
                # a project's vector env gets the per-slot seed list (the gymnasium vector API allows
                # one); a registry id's native vector_entry_point env takes one int
                envs: SlotEnvs = VectorEnvs(built[0], per_slot_seeds=self.factory.kind is FactoryKind.CALLABLE)
                if envs.num_slots != self.num_envs:
                    raise TaskArgumentError(
                        f"factory {self.factory.name} was asked for num_envs={self.num_envs} but built "
                        f"{envs.num_slots} slots"
                    )
            else:
                for _ in range(self.num_envs):
                    built.append(self.factory.build(build_args, 1))
                envs = ReplicatedEnvs(built)
            self._adopt(envs, build_args)
        except BaseException:
            for env in built:
                _close_quietly(env)
            raise
        self._envs = envs
        self._build_args = build_args
        self._rebuild = False

    def _adopt(self, envs: SlotEnvs, build_args: dict[str, Any]) -> None:
        """Derive the contract of freshly built envs and size every buffer from it."""
        sample = envs.sample_observation()
        robot_type = str(envs.metadata.get("robot_type") or _robot_name(envs.rate_sources()) or self.factory.name)
        derived = derive_contract(
            envs.single_observation_space,
            envs.single_action_space,
            sample,
            control_rate=control_rate_of(*envs.rate_sources()),
            robot_type=robot_type,
        )
        if self._contract is None:
            self._contract = resolve_contract(derived, self.contract_path)
        else:  # a rebuild with other build args must still honour the contract the clients saw
            merge_contract(self._contract, derived, source=f"the env rebuilt with {build_args}")
        contract = self._contract
        envs.contract = contract
        default_name = next(iter(derived.observation_features))
        envs.names = {name: name or default_name for name in flatten_observation(sample)}
        self._obs = {
            k: np.zeros((self.num_envs, *f.shape), dtype=f.dtype) for k, f in contract.observation_features.items()
        }
        self._float_features = [k for k, f in contract.observation_features.items() if np.dtype(f.dtype).kind == "f"]
        self._actions = ActionAdapter(
            contract.action, envs.single_action_space, self.num_envs, hold=self.hold, bounds=self.bounds
        )

    # -- requests ----------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]], seq: int = 0, *, copy: bool = True) -> Observation:
        """Start a new episode in every slot; ``tasks`` has one dict per slot.

        With ``copy=False`` the observation arrays are the bridge's own buffers, valid only until
        the next request (the server encodes them at once).
        """
        build_args, seeds, options = self._read_tasks(tasks)
        # this reset's own arguments over the operator's: nothing an earlier reset asked for lingers
        self._ensure_build({**self._operator_args, **build_args})
        envs = self._require_envs()
        self._refuse_shared_seed(envs, seeds)
        self.slots.begin(seeds)
        try:
            started = envs.reset(seeds, options, self._obs)
            if started.errors and len(started.errors) == self.num_envs:  # nothing started: the reset failed
                slot, formatted = next(iter(started.errors.items()))
                raise _ResetRaised(formatted)
        except _ResetRaised as failed:
            self.slots.fail_running(f"env.reset raised {_last_line(failed.formatted)}")
            self._rebuild = True
            raise EnvFault(
                Phase.RESET, f"env.reset raised {_last_line(failed.formatted)}", slot=None, formatted=failed.formatted
            ) from None
        except HudPipelinesError:
            self.slots.fail_running("reset refused")
            raise
        except Exception as exc:
            self.slots.fail_running(f"env.reset raised {type(exc).__name__}: {exc}")
            self._rebuild = True
            raise EnvFault(
                Phase.RESET,
                f"env.reset raised {type(exc).__name__}: {exc}",
                slot=None,
                formatted=traceback.format_exc(),
            ) from exc
        assert self._actions is not None
        self._actions.restart()
        prompts = [own or self._prompt(task) for own, task in zip(started.prompts, tasks, strict=True)]
        errors: list[SlotError] = []
        for slot, formatted in started.errors.items():
            self.slots.fail(slot, f"env.reset raised {_last_line(formatted)}")
            errors.append(
                SlotError(slot=slot, message=f"env.reset raised {_last_line(formatted)}", traceback=formatted)
            )
        nonfinite, invalid = self._end_nonfinite(self.slots.running(), None)
        errors += invalid
        return self._observation(
            seq, np.zeros(self.num_envs), copy=copy, prompts=prompts, errors=errors, nonfinite=nonfinite
        )

    def step(self, action: object, seq: int = 0, *, copy: bool = True, scalar: bool = False) -> Observation:
        """Apply one ``[N, A]`` action frame to every running slot (see :meth:`reset` for ``copy``).

        A running slot whose row is refused (not finite, out of range) ends as errored and is not
        stepped; the others are. ``scalar`` words whole-frame errors in scalar framing.
        """
        self.slots.require_running()
        envs = self._require_envs()
        assert self._actions is not None
        rows, refused = self._actions.validate(action, self.slots.running(), scalar=scalar)
        errors = [SlotError(slot=slot, message=reason, cause="action") for slot, reason in refused.items()]
        for slot, reason in refused.items():
            self.slots.fail(slot, reason)
        running = self.slots.running()
        if not running.any():  # every running row was refused: the env is not stepped at all
            return self._observation(seq, np.zeros(self.num_envs), copy=copy, errors=errors)
        try:
            tick = envs.step(self._actions.to_env(rows, batched=self.vectorized), running, self._obs)
        except HudPipelinesError:
            self.slots.fail_running("step refused")
            raise
        except Exception as exc:
            self.slots.fail_running(f"env.step raised {type(exc).__name__}: {exc}")
            self._rebuild = self.vectorized
            raise EnvFault(
                Phase.STEP, f"env.step raised {type(exc).__name__}: {exc}", slot=None, formatted=traceback.format_exc()
            ) from exc
        stepped = running.copy()
        for slot, formatted in tick.errors.items():
            self.slots.fail(slot, _last_line(formatted))
            stepped[slot] = False
        if tick.errors and not stepped.any() and not refused:
            slot, formatted = next(iter(tick.errors.items()))
            raise EnvFault(
                Phase.STEP,
                f"slot {slot}: {_last_line(formatted)}" if len(tick.errors) == 1 else _last_line(formatted),
                slot=slot if len(tick.errors) == 1 else None,
                formatted=formatted,
            )
        errors += [SlotError(slot=s, message=_last_line(f), traceback=f) for s, f in tick.errors.items()]
        nonfinite, invalid = self._end_nonfinite(stepped, tick.reward)
        errors += invalid
        stepped &= self.slots.running()
        self.slots.record_step(tick.reward, tick.terminated, tick.truncated, tick.success, stepped)
        reward = np.where(stepped, tick.reward, 0.0)
        return self._observation(seq, reward, copy=copy, errors=errors, nonfinite=nonfinite)

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

    def _read_tasks(
        self, tasks: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], list[int | None], list[dict[str, Any] | None]]:
        """Split one task per slot into the shared build arguments, the seeds and the reset options."""
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
        self._refuse_fixed(build_args)
        seeds = [_seed(episodic.get("seed"), slot) for slot, (_, episodic) in enumerate(split)]
        options = [_options(episodic.get("options"), slot) for slot, (_, episodic) in enumerate(split)]
        return build_args, seeds, options

    def _refuse_fixed(self, build_args: Mapping[str, Any]) -> None:
        """A client may repeat, never change, a registry id's ``vectorization_mode``: only the operator sets it.

        The mode decides whether worker processes start and whether every slot gets its own seed.
        """
        if self.factory.kind is not FactoryKind.REGISTRY or VECTORIZATION_MODE not in build_args:
            return
        served = self.factory.vectorization_mode(self._operator_args, self.num_envs)
        asked = build_args[VECTORIZATION_MODE]
        if asked != served:
            raise TaskArgumentError(
                f"{VECTORIZATION_MODE}={asked!r} is refused: it is fixed when the sim starts (this sim serves "
                f"{self.factory.name} with {VECTORIZATION_MODE}={served!r}); start the sim with "
                f"--arg {VECTORIZATION_MODE}={asked} to use it"
            )

    def _ensure_build(self, wanted: dict[str, Any]) -> None:
        """Rebuild the envs when ``wanted`` differs from the current build (or after an env fault)."""
        if self._envs is not None and not self._rebuild and wanted == self._build_args:
            return
        if wanted != self._build_args:
            log.info("rebuilding %s with %s", self.factory.name, wanted)
        try:
            self._build(wanted)
        except BaseException:
            self.slots.fail_running(f"building the env with {wanted} failed")
            raise

    def _refuse_shared_seed(self, envs: SlotEnvs, seeds: list[int | None]) -> None:
        """A vector env that takes one seed for the batch cannot give slots distinct seeds: refuse them."""
        if not isinstance(envs, VectorEnvs) or envs.per_slot_seeds or len(set(seeds)) <= 1:
            return
        differ = [slot for slot, seed in enumerate(seeds) if seed != seeds[0]]
        fix = (
            f"serve it with vectorization_mode=sync (each slot its own env and seed) or give every slot seed {seeds[0]}"
            if self.factory.kind is FactoryKind.REGISTRY
            else f"give every slot seed {seeds[0]}, or have its reset take a list of seeds (per_slot_seeds = True)"
        )
        raise TaskArgumentError(
            f"{self.factory.name} ({type(envs.env).__name__}) takes one seed for all {self.num_envs} slots, but the "
            f"tasks ask for seeds {seeds}: slot(s) {differ} would not get the seed they are credited with; {fix}"
        )

    def _end_nonfinite(
        self, rows: npt.NDArray[np.bool_], reward: npt.NDArray[np.float64] | None
    ) -> tuple[list[int], list[SlotError]]:
        """End the slots among ``rows`` whose float observation or reward is NaN or infinite, as errored.

        ``reward`` is ``None`` for a reset (whose observations are checked alone).

        Returns the slots whose observation was not finite (flagged on the wire and counted in their
        records) and one error per ended slot, naming the feature (or the reward) and the step.
        """
        reasons: dict[int, str] = {}
        flagged = np.zeros(self.num_envs, dtype=np.bool_)
        steps = self.slots.steps

        def when(slot: int) -> str:  # steps count from 1 within the episode; this one is not counted yet
            return "at reset" if reward is None else f"at step {int(steps[slot]) + 1}"

        for key in self._float_features:
            values = self._obs[key].reshape(self.num_envs, -1)
            if np.isfinite(values).all():
                continue
            bad = rows & ~np.isfinite(values).all(axis=1)
            flagged |= bad
            for slot in np.flatnonzero(bad).tolist():
                reasons.setdefault(slot, f"observation {key!r} is not finite {when(slot)} (slot {slot})")
        if reward is not None and not np.isfinite(reward[rows]).all():
            for slot in np.flatnonzero(rows & ~np.isfinite(reward)).tolist():
                reasons.setdefault(slot, f"reward {reward[slot]} is not finite {when(slot)} (slot {slot})")
        if flagged.any():
            self.slots.flag_nonfinite(flagged)
        for slot, reason in reasons.items():
            self.slots.fail(slot, reason)
        return np.flatnonzero(flagged).tolist(), [
            SlotError(slot=s, message=m, cause="nonfinite") for s, m in reasons.items()
        ]

    def _prompt(self, task: Mapping[str, Any]) -> str:
        described = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in sorted(task.items()) if k != "seed")
        return f"{self.factory.name} {described}".strip()

    def _observation(
        self,
        seq: int,
        reward: npt.NDArray[np.float64],
        *,
        copy: bool,
        prompts: list[str] | None = None,
        errors: list[SlotError] | None = None,
        nonfinite: list[int] | None = None,
    ) -> Observation:
        slots = self.slots
        return Observation(
            seq=seq,
            observation={k: v.copy() for k, v in self._obs.items()} if copy else dict(self._obs),
            reward=np.asarray(reward, dtype=np.float64),
            terminated=slots.terminated,
            truncated=slots.truncated,
            success=slots.success,
            status=slots.status,
            prompt=prompts,
            errors=errors or [],
            nonfinite=nonfinite or [],
        )


def _robot_name(sources: list[Any]) -> str | None:
    """What a sim that states no ``robot_type`` is called: its registry id, else its env class.

    Never the factory's function name (``make``), which says nothing about the robot.
    """
    for source in sources:
        spec = getattr(source, "spec", None)
        env_id = getattr(spec, "id", None)
        if isinstance(env_id, str) and env_id:
            return env_id
    for source in sources:
        unwrapped = getattr(source, "unwrapped", None)
        name = type(unwrapped).__name__ if unwrapped is not None else ""
        if name and name not in ("SyncVectorEnv", "AsyncVectorEnv"):  # gymnasium's generic batchers say nothing
            return name.removesuffix("VectorEnv") or name
    return None


class _ResetRaised(Exception):
    """Every slot's env raised in reset (internal: becomes an :class:`EnvFault`)."""

    def __init__(self, formatted: str) -> None:
        super().__init__(formatted)
        self.formatted = formatted


def _last_line(formatted: str) -> str:
    lines = formatted.strip().splitlines()
    return lines[-1] if lines else formatted


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:  # the build already failed; that error is the one to report
        log.debug("closing a half-built env failed", exc_info=True)


def _seed(value: object, slot: int) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TaskArgumentError(f"slot {slot}: seed must be an integer or null, got {value!r}")


def _options(value: object, slot: int) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value  # pyright: ignore[reportUnknownVariableType]
    raise TaskArgumentError(f"slot {slot}: options must be a map or null, got {value!r}")
