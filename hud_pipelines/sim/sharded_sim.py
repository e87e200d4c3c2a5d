"""The client that joins the K children of a sharded instance into one sim of N slots.

:class:`ShardedSim` holds one :class:`~hud_pipelines.sim.client.SimClient` per child (see
:mod:`hud_pipelines.sim.shards` for starting and stopping the children) and looks to the agent like one
sim of N slots. It sends every child its slice of a step before it reads any reply, so the K children
step at the same time, and joins the K replies along the slot axis into one
:class:`~hud_pipelines.wire.messages.Observation`. The agent, the recorders and the eval runner see
no difference: slot ``i`` of the instance is slot ``i`` of the joined frame, with the task (seed,
options) of slot ``i``, so its episode is the one it would have been in one sim of N slots.

What a single sim does for its finished slots, the joined sim does for a finished child: a child
whose slots have all ended is not sent any more steps (it would refuse them) and its rows keep
their final frame with a zero reward, as the sim's own hold would give them. A child that answers a
reset or step with an env fault while the others answered (its vector env raised as a whole: a slot's
own env raising errors that slot in the child's frame) ends those slots as errored with the env's error; a child
that crashes, hangs or breaks the protocol fails the whole instance with the error a single client
raises (same type, so the same :class:`~hud_pipelines.errors.Fault`), naming the child and its
slots, and every other child is stopped with it.

It is apart from the children's processes because joining is the wire side of sharding (the order
of replies, held rows, errored slices) and changes for other reasons than process lifetime; how its
errors name a child and its slots is :mod:`hud_pipelines.sim.shard_naming`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hud_pipelines.closing import Closeable
from hud_pipelines.contract import Contract
from hud_pipelines.errors import (
    ContractError,
    HudPipelinesError,
    RemoteError,
    SimError,
    WireError,
)
from hud_pipelines.sim.client import SimClient
from hud_pipelines.sim.factory import EPISODIC_ARGS
from hud_pipelines.sim.shard_naming import contract_difference, describe, instance_slots, shard_error
from hud_pipelines.sim.tasks import build_difference
from hud_pipelines.wire.messages import Observation, Result, SlotError

RUNNING = "running"
ERRORED = "errored"
ENV_FAULT_PHASES = ("reset", "step")


@dataclass
class _Sent:
    """One step of the joined sim: each child's ``seq`` for it, or ``None`` for a child that was not sent it."""

    seq: int
    shard_seqs: list[int | None]


class ShardedSim(Closeable):
    """K clients, each of a slice of the slots, driven as one sim of their total (the agent's ``PipelinedSim``).

    Steps go out to every child before any reply is read, so the children step in parallel; the
    replies are joined along the slot axis. Steps are read in the order they were sent (a later
    ``seq`` reads the earlier ones first and keeps them for their caller). ``on_failure`` runs when a
    child fails the instance (crash, timeout, protocol): the pool passes "kill every child".
    """

    def __init__(self, clients: Sequence[SimClient], *, on_failure: Callable[[], None] | None = None) -> None:
        if not clients:
            raise ValueError("a sharded sim needs at least one client")
        self.clients = list(clients)
        self._on_failure = on_failure or (lambda: None)
        self.slots: list[range] = []
        start = 0
        for client in self.clients:
            self.slots.append(range(start, start + client.num_envs))
            start += client.num_envs
        self._num_envs = start
        self._broken: str | None = None
        self._check_contracts()
        self.contract: Contract = self.clients[0].contract
        self._last: list[Observation | None] = [None] * len(self.clients)
        """Each child's latest frame: what a finished child's rows repeat."""
        self._seq = 0
        self._sent: deque[_Sent] = deque()
        self._arrived: dict[int, Observation] = {}

    @property
    def num_envs(self) -> int:
        return self._num_envs

    @property
    def shards(self) -> int:
        return len(self.clients)

    @property
    def usable(self) -> bool:
        return self._broken is None and all(c.usable for c in self.clients)

    def still_connected(self) -> bool:
        return self._broken is None and all(c.still_connected() for c in self.clients)

    # -- requests ------------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]] | dict[str, Any] | None = None) -> Observation:
        """Reset every child with its slots' tasks, all at once; one joined frame."""
        self._require_usable()
        if tasks is None:
            tasks = {}
        if isinstance(tasks, dict):
            tasks = [dict(tasks) for _ in range(self.num_envs)]
        if len(tasks) != self.num_envs:
            raise SimError(f"reset needs one task per slot: {self.num_envs} slots, {len(tasks)} tasks")
        self._sent.clear()
        self._arrived.clear()
        slices = [tasks[slots.start : slots.stop] for slots in self.slots]
        with ThreadPoolExecutor(max_workers=self.shards, thread_name_prefix="hud-shard-reset") as pool:
            futures = [pool.submit(client.reset, part) for client, part in zip(self.clients, slices, strict=True)]
            outcomes: list[Observation | BaseException] = [_outcome(f.result, f.exception()) for f in futures]
        self._seq += 1
        joined = self._join(self._seq, outcomes, phase="reset", sent=[True] * self.shards)
        # Each child compares only its own slice's builds; after them, so that a key no factory takes is refused
        # in the children's words first, as one sim refuses it before it compares builds.
        if (differs := build_difference([_build_part(task) for task in tasks])) is not None:
            raise SimError(differs)
        return joined

    def step(self, action: npt.NDArray[Any]) -> Observation:
        return self.receive_step(self.send_step(action))

    def send_step(self, action: npt.NDArray[Any]) -> int:
        """Send each child its rows of the ``[N, A]`` frame (a child whose slots all ended gets none)."""
        self._require_usable()
        frame = np.asarray(action)
        if self.num_envs == 1 and frame.ndim <= 1:
            frame = frame.reshape(1, -1)
        if frame.ndim < 1 or frame.shape[0] != self.num_envs:
            raise SimError(f"a step needs one action row per slot: {self.num_envs} slots, frame {frame.shape}")
        self._seq += 1
        sent = _Sent(self._seq, [None] * self.shards)
        for shard, client in enumerate(self.clients):
            if self._finished(shard):
                continue
            slots = self.slots[shard]
            try:
                sent.shard_seqs[shard] = client.send_step(frame[slots.start : slots.stop])
            except (SimError, WireError) as exc:
                raise self._fail(shard, exc) from exc
        self._sent.append(sent)
        return sent.seq

    def receive_step(self, seq: int) -> Observation:
        """The joined frame that answers step ``seq`` (earlier steps are read first and kept)."""
        while seq not in self._arrived:
            self._require_usable()
            if not self._sent or self._sent[0].seq > seq:
                raise SimError(f"no step numbered {seq} is waiting for a reply from the sharded sim")
            sent = self._sent.popleft()
            self._arrived[sent.seq] = self._receive(sent)
        return self._arrived.pop(seq)

    def result(self) -> Result:
        """Every child's grades, joined: one slot dict per slot (numbered as the instance's), the mean score."""
        self._require_usable()
        parts: list[Result] = []
        for shard, client in enumerate(self.clients):
            try:
                parts.append(client.result())
            except RemoteError as exc:
                raise self._renamed(exc, shard) from exc
            except (SimError, WireError) as exc:
                raise self._fail(shard, exc) from exc
        slots = [
            {**grade, "slot": self.slots[shard].start + index}
            for shard, part in enumerate(parts)
            for index, grade in enumerate(part.slots)
        ]
        scores = [float(grade.get("score", 0.0)) for grade in slots]
        return Result(
            seq=self._seq,
            score=float(np.mean(scores)) if scores else 0.0,
            success=all(part.success for part in parts),
            slots=slots,
        )

    def close(self) -> None:
        """Close every child's connection; safe to call twice."""
        self._broken = self._broken or "the client was closed"
        for client in self.clients:
            with contextlib.suppress(Exception):
                client.close()

    # -- joining -------------------------------------------------------------------------------------

    def _receive(self, sent: _Sent) -> Observation:
        """Read every child's reply to one step (all of them, so each link stays in step), then join them."""
        outcomes: list[Observation | BaseException] = []
        for shard, client in enumerate(self.clients):
            shard_seq = sent.shard_seqs[shard]
            if shard_seq is None:
                outcomes.append(self._held(shard))
                continue
            try:
                outcomes.append(client.receive_step(shard_seq))
            except RemoteError as exc:
                # a step sent ahead to a child whose slots ended meanwhile is refused: its rows stay as they were
                outcomes.append(self._held(shard) if self._finished(shard) else exc)
            except (SimError, WireError) as exc:
                raise self._fail(shard, exc) from exc
        return self._join(sent.seq, outcomes, phase="step", sent=[s is not None for s in sent.shard_seqs])

    def _join(
        self, seq: int, outcomes: list[Observation | BaseException], *, phase: str, sent: list[bool]
    ) -> Observation:
        """One frame of every child's reply; a child's env fault ends its slots when another child answered."""
        for shard, outcome in enumerate(outcomes):
            if isinstance(outcome, RemoteError | Observation):
                continue
            if isinstance(outcome, SimError | WireError):
                raise self._fail(shard, outcome) from outcome
            self._fail(shard, SimError(f"{type(outcome).__name__}: {outcome}"))
            raise outcome
        answered = [o for o in outcomes if isinstance(o, Observation)]
        refused = [(s, o) for s, o in enumerate(outcomes) if isinstance(o, RemoteError)]
        if refused and (not answered or not all(_env_fault(o, phase) for _, o in refused)):
            shard, first = refused[0]
            raise self._renamed(first, shard) from first
        frames: list[Observation] = []
        for shard, outcome in enumerate(outcomes):
            frame = outcome if isinstance(outcome, Observation) else self._errored(shard, outcome, phase)
            if sent[shard]:
                self._last[shard] = frame
            frames.append(frame)
        return self._joined(seq, frames)

    def _joined(self, seq: int, frames: list[Observation]) -> Observation:
        offsets = [slots.start for slots in self.slots]
        prompts = [f.prompt for f in frames]
        return Observation(
            seq=seq,
            observation={name: np.concatenate([f.observation[name] for f in frames]) for name in frames[0].observation},
            reward=np.concatenate([f.reward for f in frames]),
            terminated=np.concatenate([f.terminated for f in frames]),
            truncated=np.concatenate([f.truncated for f in frames]),
            success=np.concatenate([f.success for f in frames]),
            success_reported=np.concatenate([f.success_reported for f in frames]),
            success_now=np.concatenate([f.success_now for f in frames]),
            status=[status for f in frames for status in f.status],
            prompt=None
            if all(p is None for p in prompts)
            else [text for f, p in zip(frames, prompts, strict=True) for text in (p or [""] * f.num_slots)],
            errors=[
                dataclasses.replace(error, slot=error.slot + offset, message=instance_slots(error.message, offset))
                for f, offset in zip(frames, offsets, strict=True)
                for error in f.errors
            ],
            nonfinite=[slot + offset for f, offset in zip(frames, offsets, strict=True) for slot in f.nonfinite],
        )

    def _held(self, shard: int) -> Observation:
        """A finished child's rows for a step it was not sent: its last frame, nothing earned, nothing new."""
        last = self._last[shard]
        assert last is not None, "a child is only left out after it answered once"
        return dataclasses.replace(last, reward=np.zeros_like(last.reward), prompt=None, errors=[], nonfinite=[])

    def _errored(self, shard: int, fault: BaseException, phase: str) -> Observation:
        """The frame of a child whose env raised as a whole (a vector env, which no slot owns): the slots it ran
        end errored with its words, as one sim's slots end with them (a slot's own exception comes in a frame)."""
        assert isinstance(fault, RemoteError)
        last = self._last[shard]
        count = len(self.slots[shard])
        ran = [True] * count if phase == "reset" or last is None else [s == RUNNING for s in last.status]
        message = fault.message  # renumbered when joined
        if last is None or phase == "reset":
            observation = {
                name: np.zeros((count, *feature.shape), dtype=feature.dtype)
                for name, feature in self.contract.observation_features.items()
            }
            f = [np.zeros(count, dtype=np.bool_) for _ in range(5)]  # terminated, truncated and the success flags
            last = Observation(0, observation, np.zeros(count), f[0], f[1], f[2], f[3], f[4], [RUNNING] * count)
        return dataclasses.replace(
            last,
            reward=np.zeros(count),
            status=[ERRORED if r else s for r, s in zip(ran, last.status, strict=True)],
            prompt=None,
            errors=[
                SlotError(slot=s, message=message, traceback=fault.remote_traceback) for s in range(count) if ran[s]
            ],
            nonfinite=[],
        )

    # -- failures ------------------------------------------------------------------------------------

    def _finished(self, shard: int) -> bool:
        """Whether every slot of ``shard`` had ended in its latest frame (it takes no more steps)."""
        last = self._last[shard]
        return last is not None and RUNNING not in last.status

    def _fail(self, shard: int, exc: SimError | WireError) -> HudPipelinesError:
        """``shard`` failed the instance: stop every child, and return its error naming it (slots as the instance's,
        as later requests say it too)."""
        renamed = self._renamed(exc, shard)
        self._broken = str(renamed)
        with contextlib.suppress(Exception):
            self._on_failure()
        self.close()
        return renamed

    def _renamed(self, exc: SimError | WireError, shard: int) -> HudPipelinesError:
        return shard_error(exc, self._name(shard), self.slots[shard].start)

    def _name(self, shard: int) -> str:
        return describe(shard, self.slots[shard], self.shards)

    def _require_usable(self) -> None:
        if self._broken is not None:
            raise SimError(f"the sharded sim is unusable: {self._broken}")

    def _check_contracts(self) -> None:
        """Every child must serve the same contract: the joined frame has one."""
        first = self.clients[0].contract
        for shard, client in enumerate(self.clients[1:], start=1):
            if client.contract != first:
                self.close()
                raise ContractError(
                    f"{self._name(shard)} serves another contract than {self._name(0)} "
                    f"({contract_difference(first, client.contract)}): every shard of an instance must serve "
                    "the same features"
                )


def _build_part(task: dict[str, Any]) -> dict[str, Any]:
    """What of a task the sim builds from: all but its episodic arguments (:meth:`Factory.split_task`)."""
    return {key: value for key, value in task.items() if key not in EPISODIC_ARGS}


def _outcome(result: Callable[[], Observation], exc: BaseException | None) -> Observation | BaseException:
    return exc if exc is not None else result()


def _env_fault(exc: RemoteError, phase: str) -> bool:
    """The child's env raised (it sends its traceback) during a reset or step: its slots, not the link, failed."""
    return exc.phase in ENV_FAULT_PHASES and exc.phase == phase and exc.remote_traceback is not None


__all__ = ["ShardedSim"]
