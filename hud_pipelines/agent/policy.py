"""The one seam between the agent loop and any policy: a batched ``infer``.

A policy maps a batch of observations (one row per slot that needs actions, keyed by the contract's
feature names) plus one prompt per row to a chunk of actions per row, ``[B, T, A]`` float32 in
contract order. Everything else (LeRobot's tensors, a torch module's inputs, a remote server's
frames) is the business of the policy behind the seam.

:class:`BasePolicy` is that seam with its optional members spelled out, each with its default
(openpi's ``BasePolicy`` idea): every built-in kind derives from it, and the agent reads the members
directly, never by probing:

- ``reset()``: called at the start of every run of episodes where one starts (stateful policies clear their
  state);
- ``horizon``: how many actions of a chunk the policy wants executed before it is asked again
  (LeRobot's ``n_action_steps``); the agent's own ``horizon`` setting wins over it;
- ``observation_steps``: how many past observations the policy reads (LeRobot's ``n_obs_steps``);
  above one, the agent keeps each slot's last frames and passes ``[B, n, ...]`` arrays;
- ``lockstep(idle_sims)``: a context manager :class:`~hud_pipelines.agent.batching.BatchedModel`
  enters around a forward that every sim waits on; torch-backed policies run that forward on the
  idle sims' cores (``lockstep_threads``);
- ``last_forward_rows()``: the rows of the forward that served this thread's last call (larger
  than the call under ``BatchedModel``, which stacks callers);
- ``abandon()``: called from another thread when ``BatchedModel`` gives up on a forward that is late
  (``forward_timeout_s``), with its lock held, so it must not block: a policy that can cut short what
  that forward waits on (a remote one's connection) does, so that the forwards after it need not wait.

A user's object with an ``infer`` (a scripted target) is any :class:`Policy`; :func:`as_base_policy`
adapts it once, at that boundary, reading whichever optional members it has.
:func:`hud_pipelines.agent.factory.build_policy` turns a ``kind``-discriminated config into a policy.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from hud_pipelines.contract import to_numpy
from hud_pipelines.errors import PolicyError, PolicyShapeError

Actions = npt.NDArray[np.float32]
"""``[B, T, A]`` action chunks in contract order."""

RandomStream = tuple[int, ...]
"""Which random stream a row draws from: ``(SEEDED_STREAM, task, seed, episode, forward)`` for an episode
with a seed, else ``(task, instance, slot, episode, forward)``, where ``task`` is a 64-bit digest of the
task's name (a matrix arm's: its control's; the task's index for a caller that names no tasks) and
``forward`` counts the policy calls made for that episode so far.

A stochastic policy seeds one generator per row from its own seed and the row's stream
(:meth:`PolicyBatch.generators`), so what a row draws depends only on which episode it belongs to and
how far that episode has come: never on which other rows share the forward, how many instances run at
once, how many slots a sim has (``num_envs`` moves a seed to another instance and slot) or how the threads
were timed. That is what makes an eval with a sampling policy bit-identical under any ``max_concurrent``,
``send_ahead``, ``num_envs`` or batch composition, and its episodes pair by task and seed in ``compare``."""

SEEDED_STREAM = 2**32 - 2
"""The first entry of a seeded episode's stream, which tells the two forms apart (a ``SeedSequence`` ignores
trailing zeros, so streams of unequal length are not told apart by length): no task index reaches it, and a
name's digest meets it with a chance of one in 2**64."""


@dataclass(frozen=True)
class PolicyBatch:
    """Observations of ``B`` slots: ``observation[name]`` is ``[B, ...]``; one prompt per row.

    Arrays are writable (the agent copies read-only wire buffers before they get here), so a
    policy may hand them to ``torch.from_numpy`` or modify them in place. ``episodes`` names the
    episode each row belongs to (the agent passes trace ids); a policy that keeps state across
    calls (ACT's temporal ensembling) keys it on them, since rows are only the slots that need
    actions and their order changes as slots finish. A forward that raises is run again row by row
    (to end only the rows it raises on), so such a policy changes that state only once a forward returns.
    """

    observation: dict[str, npt.NDArray[Any]]
    prompts: list[str]
    episodes: list[str] | None = None
    streams: list[RandomStream] | None = None
    """Per row, the identity of the random stream this row's draws come from (see :data:`RandomStream`)."""

    def __post_init__(self) -> None:
        for name, array in self.observation.items():
            if array.shape[:1] != (len(self.prompts),):
                raise PolicyError(
                    f"observation {name!r} has {array.shape[0] if array.ndim else 0} rows "
                    f"for {len(self.prompts)} prompts"
                )
        if self.episodes is not None and len(self.episodes) != len(self.prompts):
            raise PolicyError(f"{len(self.episodes)} episode ids for {len(self.prompts)} rows")
        if self.streams is not None and len(self.streams) != len(self.prompts):
            raise PolicyError(f"{len(self.streams)} random streams for {len(self.prompts)} rows")

    @property
    def size(self) -> int:
        return len(self.prompts)

    def rows(self, index: Sequence[int] | npt.NDArray[np.intp]) -> PolicyBatch:
        """The batch of the given rows (fancy indexing copies, so the result is writable)."""
        picked = np.asarray(index, dtype=np.intp)
        rows: list[int] = picked.tolist()
        return PolicyBatch(
            observation={k: v[picked] for k, v in self.observation.items()},
            prompts=[self.prompts[i] for i in rows],
            episodes=None if self.episodes is None else [self.episodes[i] for i in rows],
            streams=None if self.streams is None else [self.streams[i] for i in rows],
        )

    @staticmethod
    def concat(batches: Sequence[PolicyBatch]) -> PolicyBatch:
        """Stack batches row-wise (used to coalesce callers); every batch must have the same features."""
        if len(batches) == 1:
            return batches[0]
        keys = batches[0].observation.keys()
        for other in batches[1:]:
            if other.observation.keys() != keys:
                raise PolicyError(
                    f"cannot stack batches with different features: {sorted(keys)} vs {sorted(other.observation)}"
                )
        episodes = [b.episodes for b in batches]
        streams = [b.streams for b in batches]
        return PolicyBatch(
            observation={k: np.concatenate([b.observation[k] for b in batches]) for k in keys},
            prompts=[p for b in batches for p in b.prompts],
            episodes=None if any(e is None for e in episodes) else [i for e in episodes for i in e or []],
            streams=None if any(r is None for r in streams) else [i for r in streams for i in r or []],
        )

    def generators(self, seed: int) -> list[np.random.Generator]:
        """One numpy generator per row, from ``seed`` and the row's stream (see :data:`RandomStream`).

        A batch without streams (a caller that names no episodes) gets generators from ``seed`` and
        the row index: reproducible for the same calls in the same order.
        """
        streams = self.streams or [(row,) for row in range(self.size)]
        return [np.random.default_rng([seed, *stream]) for stream in streams]


@dataclass
class Forwards:
    """Policy forwards counted: how many, their rows (in all and each) and the seconds spent in them.

    An agent counts its own ``infer`` calls; a shared batching model counts the forwards they were
    gathered into: the same record, so a benchmark reads both alike.
    """

    count: int = 0
    rows: int = 0
    rows_each: list[int] = field(default_factory=list[int])
    """Rows of every forward, in order."""
    seconds: float = 0.0

    def add(self, rows: int, seconds: float) -> None:
        self.count += 1
        self.rows += rows
        self.rows_each.append(rows)
        self.seconds += seconds


@dataclass
class BatchingStats:
    """What a shared batching model (:class:`~hud_pipelines.agent.batching.BatchedModel`) did."""

    forwards: Forwards = field(default_factory=Forwards)
    """The forwards of the policy (stacking included in their seconds), each with the rows it gathered."""
    calls: int = 0
    timer_flushes: int = 0
    """Forwards started because the window ran out (not because every caller was waiting)."""
    lockstep_forwards: int = 0
    """Forwards started while every expected caller was waiting (run inside ``policy.lockstep``)."""


@runtime_checkable
class Policy(Protocol):
    """Maps a batch of observations to ``[B, T, A]`` float32 action chunks (the least a user's policy has)."""

    def infer(self, batch: PolicyBatch) -> Actions: ...


class BasePolicy(ABC):
    """A policy with every optional member explicit (see the module docstring); override what differs."""

    horizon: int | None = None
    observation_steps: int = 1

    @abstractmethod
    def infer(self, batch: PolicyBatch) -> Actions:
        """``[B, T, A]`` float32 action chunks for the ``B`` rows of ``batch``."""

    def reset(self) -> None:  # noqa: B027 - optional, with a default that does nothing
        """Clear per-episode state at the start of a run of episodes (nothing by default)."""

    def lockstep(self, idle_sims: int) -> AbstractContextManager[object]:
        """A context around a forward every sim waits on (nothing by default)."""
        return contextlib.nullcontext()

    def last_forward_rows(self) -> int | None:
        """Rows of the forward that served this thread's last call, when that differs from the call's."""
        return None

    def abandon(self) -> None:  # noqa: B027 - optional, with a default that does nothing
        """Cut short a forward that was given up on, from another thread, without blocking (nothing by default)."""


class _UserPolicy(BasePolicy):
    """A user's policy object seen through :class:`BasePolicy`: its optional members, read once."""

    def __init__(self, policy: Policy) -> None:
        if not callable(getattr(policy, "infer", None)):  # every episode would error on it, one by one
            raise PolicyError(
                f"{type(policy).__name__} has no infer(batch) method; a policy answers a PolicyBatch with actions "
                "[B, T, A] or [B, A] (a LeRobot policy object is loaded through the pipeline's 'lerobot' policy, "
                "or wrapped by a scripted one)"
            )
        self.policy = policy
        self.horizon = _positive_int(getattr(policy, "horizon", None))
        self.observation_steps = _positive_int(getattr(policy, "observation_steps", None)) or 1
        reset, lockstep = getattr(policy, "reset", None), getattr(policy, "lockstep", None)
        abandon = getattr(policy, "abandon", None)
        self._reset = reset if callable(reset) else None
        self._lockstep = lockstep if callable(lockstep) else None
        self._abandon = abandon if callable(abandon) else None

    def infer(self, batch: PolicyBatch) -> Actions:
        return self.policy.infer(batch)

    def reset(self) -> None:
        if self._reset is not None:
            self._reset()

    def lockstep(self, idle_sims: int) -> AbstractContextManager[object]:
        if self._lockstep is None:
            return contextlib.nullcontext()
        return cast(AbstractContextManager[object], self._lockstep(idle_sims))

    def abandon(self) -> None:
        if self._abandon is not None:
            self._abandon()


def as_base_policy(policy: Policy | BasePolicy) -> BasePolicy:
    """``policy`` itself when it is a :class:`BasePolicy`, else the adapter for a user's object."""
    return policy if isinstance(policy, BasePolicy) else _UserPolicy(policy)


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


FLOAT32_MAX = float(np.finfo(np.float32).max)


def action_array(actions: object, *, source: str, expected: str) -> npt.NDArray[np.float32]:
    """A policy's answer as float32 numbers; what is no array of numbers is an error naming ``source`` and the
    ``expected`` shape (numpy's own words named neither). It is a :class:`PolicyError`, not a shape error: a row's
    own answer may be what broke it (a ragged list), so a stacked forward is run again per caller to find it."""
    try:
        numbers = np.asarray(to_numpy(actions))  # a tensor that requires grad, or on a GPU, too
        wide = numbers.dtype.kind == "f" and numbers.dtype.itemsize > 4
        if wide and not (np.abs(numbers) <= FLOAT32_MAX).all():  # past float32's range is out of bounds, not inf
            numbers = np.clip(numbers, -FLOAT32_MAX, FLOAT32_MAX, out=numbers.copy(), where=np.isfinite(numbers))
        return numbers if numbers.dtype == np.float32 else numbers.astype(np.float32)
    except (TypeError, ValueError) as exc:  # a dict, a generator, strings, ragged rows: no array of numbers
        raise PolicyError(
            f"{source} returned a {type(actions).__name__} that is no array of numbers ({exc}); expected {expected}"
        ) from None


def as_chunks(actions: object, rows: int, width: int, *, source: str) -> Actions:
    """Normalise a policy's output to ``[rows, T, width]`` float32; ``[rows, width]`` means ``T = 1``.

    A shape that cannot be read that way is an error naming ``source`` and the expected shape.
    """
    array = action_array(actions, source=source, expected=f"[B={rows}, T, A={width}] or [B={rows}, A={width}]")
    shape = array.shape
    if len(shape) == 3 and shape[0] == rows and shape[2] == width and shape[1] >= 1:  # the usual answer: chunks
        return array
    if len(shape) == 2 and shape == (rows, width):
        return array[:, None, :]
    if len(shape) == 1 and width == 1 and shape == (rows,):
        return array.reshape(rows, 1, 1)
    raise PolicyShapeError(
        f"{source} returned actions of shape {list(array.shape)}; "
        f"expected [B={rows}, T, A={width}] or [B={rows}, A={width}]"
    )
