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
is refused, or whose observation or reward is NaN or infinite, or whose own env raised, ends as
*errored* at once, with the reason, while the other slots go on. Every slot raising in one reset or
step is no different: each slot keeps its own words, so an episode's error reads the same however
the instance's slots are split between sims (``shards``). Only an exception of a vector env as a
whole, which no slot owns, is an :class:`~hud_pipelines.errors.EnvFault` of the request.

Build arguments belong to one connection: the operator's (``build_args``) are the base, a
connection's resets add their own on top, and :meth:`begin_connection` drops them again, so what one
client asked for never reaches the next. How a reset's tasks are read (and refused) is
:mod:`.tasks`; how NaN and infinity are caught, :mod:`.screen`.

It does no I/O and no threading: the server calls it on the sim's main thread, and tests and the
in-process baseline call it directly.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import Contract, derive_env_contract, merge_contract, resolve_contract
from hud_pipelines.errors import EnvFault, HudPipelinesError, Phase, exception_line
from hud_pipelines.sim.actions import ActionAdapter, BoundsMode, HoldMode
from hud_pipelines.sim.building import built_envs
from hud_pipelines.sim.envs import (
    ENV_FAILURES,
    REBUILD,
    START_UP,
    ObservationBuffer,
    ProbeReset,
    SlotEnvs,
    VectorEnvs,
)
from hud_pipelines.sim.factory import Factory, resolve_factory
from hud_pipelines.sim.screen import all_finite, screen_nonfinite
from hud_pipelines.sim.slots import SlotBatch, every, seed_named, some
from hud_pipelines.sim.tasks import read_tasks, refuse_shared_seed, task_prompt
from hud_pipelines.wire.messages import Observation, SlotError

log = logging.getLogger(__name__)


class GymBridge:
    """Serve ``num_envs`` slots of the env that ``factory`` builds.

    ``hold`` is what a finished slot receives while the others keep stepping; ``bounds`` says what
    happens to continuous actions outside the contract's bounds (see :mod:`hud_pipelines.sim.actions`);
    ``probes``: the resets tried in turn at start-up, the first that works giving the observation the contract is
    derived from (:class:`ProbeReset`; by default one without arguments).
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
        probes: Sequence[ProbeReset] = (),
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.factory = resolve_factory(factory) if isinstance(factory, str) else factory
        self.num_envs = num_envs
        self.contract_path = contract_path
        self.hold = hold
        self.bounds = bounds
        self.probes = tuple(probes) or (ProbeReset(),)
        self.slots = SlotBatch(num_envs)
        self.operator_args: dict[str, Any] = dict(build_args or {})
        """The build arguments the sim was started with: every connection starts from these."""
        self._build_args: dict[str, Any] = dict(self.operator_args)
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
        self._build(self._build_args, self.probes)
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

    def _build(self, build_args: dict[str, Any], probes: Sequence[ProbeReset]) -> None:
        """(Re)build the envs, probed with the first of ``probes`` whose reset works, each tried on envs built anew:
        an env whose reset raised may be broken for good (a worker of gymnasium's ``AsyncVectorEnv`` exits)."""
        assert probes, "at least one probe reset"
        failed: list[EnvFault] = []
        for probe in probes:
            try:
                return self._build_probed(build_args, probe)
            except EnvFault as fault:  # the probe's reset raised: the next one may work
                log.info("%s", fault)
                failed.append(fault)
        first = failed[0]
        others = f"; the {len(failed) - 1} other probe reset(s) given raised too" if len(failed) > 1 else ""
        raise EnvFault(first.phase, f"{first}{others}", slot=None, formatted=first.formatted) from first.__cause__

    def _build_probed(self, build_args: dict[str, Any], probe: ProbeReset) -> None:
        """Build the envs and derive the contract from ``probe``'s reset; on any failure none are left half-built."""
        self.close()
        with built_envs(self.factory, build_args, self.num_envs) as envs:
            self._adopt(envs, build_args, probe)
        self._envs = envs
        self._build_args = build_args
        self._rebuild = False

    def _adopt(self, envs: SlotEnvs, build_args: dict[str, Any], probe: ProbeReset) -> None:
        """Derive the contract of freshly built envs and size every buffer from it."""
        sample = envs.probe(probe, when=START_UP if self._contract is None else REBUILD)
        name = self.factory.name
        derived = derive_env_contract(
            envs.source, envs.single_observation_space, envs.single_action_space, sample, fallback_name=name
        )
        if self._contract is None:
            self._contract = resolve_contract(derived.contract, self.contract_path)
        else:  # a rebuild with other build args must still honour the contract the clients saw
            merge_contract(self._contract, derived.contract, source=f"the env rebuilt with {build_args}")
        contract = self._contract
        envs.contract = contract
        envs.names = derived.names
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
        read = read_tasks(self.factory, self.num_envs, self.operator_args, tasks)
        # this reset's own arguments over the operator's: nothing an earlier reset asked for lingers
        self._ensure_build({**self.operator_args, **read.build_args}, ProbeReset(read.seeds[0], read.options[0]))
        envs = self._require_envs()
        refuse_shared_seed(self.factory, envs, read.seeds)
        self.slots.begin(read.seeds)
        try:
            started = envs.reset(read.seeds, read.options, self._obs)
        except HudPipelinesError:
            self.slots.fail_running("reset refused")
            raise
        except ENV_FAILURES as exc:
            raise self._reset_failed(f"{type(exc).__name__}: {exc}", traceback.format_exc()) from exc
        assert self._actions is not None
        self._actions.restart()
        prompts = [own or task_prompt(self.factory, task) for own, task in zip(started.prompts, tasks, strict=True)]
        errors: list[SlotError] = []
        for slot, formatted in started.errors.items():
            said = "building the env anew raised" if slot in started.unbuilt else "env.reset raised"
            message = f"{said} {exception_line(formatted)} ({self._where(slot)})"
            self.slots.fail(slot, message)
            errors.append(SlotError(slot=slot, message=message, traceback=formatted))
        nonfinite, invalid = self._end_nonfinite(self.slots.running(), None)
        errors += invalid
        return self._observation(
            seq, np.zeros(self.num_envs), copy=copy, prompts=prompts, errors=errors, nonfinite=nonfinite
        )

    def _reset_failed(self, said: str, formatted: str) -> EnvFault:
        """A reset the envs raised as a whole: every slot fails with what was raised, and the envs are built anew."""
        self.slots.fail_running(f"env.reset raised {said}")
        self._rebuild = True
        return EnvFault(Phase.RESET, f"env.reset raised {said}", slot=None, formatted=formatted)

    def step(self, action: object, seq: int = 0, *, copy: bool = True, scalar: bool = False) -> Observation:
        """Apply one ``[N, A]`` action frame to every running slot (see :meth:`reset` for ``copy``).

        A running slot whose row is refused (not finite, out of range) ends as errored and is not
        stepped; the others are. ``scalar`` words whole-frame errors in scalar framing.
        """
        self.slots.require_running()
        envs = self._require_envs()
        assert self._actions is not None
        rows, refused = self._actions.validate(
            action, self.slots.running(), lambda slot: self._where(slot, stepping=True), scalar=scalar
        )
        errors = [SlotError(slot=slot, message=reason, cause="action") for slot, reason in refused.items()]
        for slot, reason in refused.items():
            self.slots.fail(slot, reason)
        running = self.slots.running()
        if not some(running):  # every running row was refused: the env is not stepped at all
            return self._observation(seq, np.zeros(self.num_envs), copy=copy, errors=errors)
        try:
            tick = envs.step(self._actions.to_env(rows, batched=self.vectorized), running, self._obs)
        except HudPipelinesError:
            self.slots.fail_running("step refused")
            raise
        except ENV_FAILURES as exc:
            self.slots.fail_running(f"env.step raised {type(exc).__name__}: {exc}")
            self._rebuild = self.vectorized
            raise EnvFault(
                Phase.STEP, f"env.step raised {type(exc).__name__}: {exc}", slot=None, formatted=traceback.format_exc()
            ) from exc
        if (
            not refused and not tick.errors and all_finite(self._obs, self._float_features, tick.reward)
        ):  # the usual tick
            self.slots.record_step(tick.reward, tick.terminated, tick.truncated, tick.success, running)
            reward = tick.reward if every(running) else np.where(running, tick.reward, 0.0)
            return self._observation(seq, reward, copy=copy)
        stepped = running.copy()
        raised = {
            slot: f"{exception_line(formatted)} ({self._where(slot, stepping=True)})"
            for slot, formatted in tick.errors.items()
        }
        for slot, message in raised.items():
            self.slots.fail(slot, message)
            stepped[slot] = False
        errors += [SlotError(slot=s, message=raised[s], traceback=f) for s, f in tick.errors.items()]
        nonfinite, invalid = self._end_nonfinite(stepped, tick.reward)
        errors += invalid
        stepped &= self.slots.running()
        self.slots.record_step(tick.reward, tick.terminated, tick.truncated, tick.success, stepped)
        reward = np.where(stepped, tick.reward, 0.0)
        return self._observation(seq, reward, copy=copy, errors=errors, nonfinite=nonfinite)

    def _where(self, slot: int, *, stepping: bool = False) -> str:
        """Which episode a fault hit, for its message (``seed 5, step 3``): the env's own text rarely says.

        Not the slot: the error frame carries it, renumbered where a sharded instance joins children.
        """
        record = self.slots.record(slot)
        seed = seed_named(record.seed)
        return f"{seed}, step {record.steps + 1}" if stepping else seed

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

    def _ensure_build(self, wanted: dict[str, Any], probe: ProbeReset) -> None:
        """Rebuild the envs when ``wanted`` differs from the current build (or after an env fault), probed
        with the reset's own first slot's arguments (the tasks it rebuilds for may need theirs)."""
        if self._envs is not None and not self._rebuild and wanted == self._build_args:
            return
        if wanted != self._build_args:
            log.info("rebuilding %s with %s", self.factory.name, wanted)
        try:
            self._build(wanted, (probe,))
        except BaseException as exc:
            self.slots.fail_running(f"building the env with {wanted} failed")
            if isinstance(exc, HudPipelinesError) or not isinstance(exc, ENV_FAILURES):
                raise
            said = f"building the env with {wanted} raised {type(exc).__name__}: {exc}"  # sys.exit() too: not the sim's
            raise EnvFault(Phase.RESET, said, slot=None, formatted=traceback.format_exc()) from exc

    def _end_nonfinite(
        self, rows: npt.NDArray[np.bool_], reward: npt.NDArray[np.float64] | None
    ) -> tuple[list[int], list[SlotError]]:
        """End the slots among ``rows`` whose float observation or reward is NaN or infinite, as errored.

        Returns the slots whose observation was not finite (flagged on the wire and counted in their
        records) and one error per ended slot, naming the feature (or the reward) and the step.
        """
        if all_finite(self._obs, self._float_features, reward):  # the usual frame: nothing to screen slot by slot
            return [], []
        found = screen_nonfinite(
            self._obs, self._float_features, rows, reward, lambda slot: self._where(slot, stepping=reward is not None)
        )
        if found.flagged.any():
            self.slots.flag_nonfinite(found.flagged)
        for slot, reason in found.reasons.items():
            self.slots.fail(slot, reason)
        errors = [SlotError(slot=s, message=m, cause="nonfinite") for s, m in found.reasons.items()]
        return np.flatnonzero(found.flagged).tolist(), errors

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
        return Observation(
            seq=seq,
            observation={k: v.copy() for k, v in self._obs.items()} if copy else dict(self._obs),
            reward=np.asarray(reward, dtype=np.float64),
            **self.slots.ends(),
            status=self.slots.status,
            prompt=prompts,
            errors=errors or [],
            nonfinite=nonfinite or [],
        )
