"""One instance of N slots served by K sim processes: starting, judging and stopping the children.

A served sim steps its slots one after the other on its main thread, so a sim whose step costs
5 ms ticks at 4 x 5 ms for four slots. ``sim.shards: K`` spreads the instance's slots over K
children (each a sim of its own slice): :class:`ShardedProcess` starts them together, answers the
pool for all of them at once and stops them together; its ``connect`` hands the agent one
:class:`~hud_pipelines.sim.sharded_sim.ShardedSim` that joins their replies into the frames of one
sim of N slots (see :mod:`hud_pipelines.sim.sharded_sim`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hud_pipelines.errors import SimError, SimStartError, WireError
from hud_pipelines.sim.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_STEP_TIMEOUT_S, SimClient
from hud_pipelines.sim.process import DEFAULT_GRACE_S, SimProcess
from hud_pipelines.sim.shard_naming import describe, shard_error
from hud_pipelines.sim.sharded_sim import ShardedSim
from hud_pipelines.wire.messages import DEFAULT_MAX_FRAME_BYTES, Framing


def split_slots(num_envs: int, shards: int) -> list[range]:
    """The slots of each of ``shards`` children, in order, as even as possible.

    ``num_envs`` need not be a multiple of ``shards``: the first ``num_envs % shards`` children take
    one slot more. Users size ``shards`` by their cores and ``num_envs`` by their experiment; asking
    one to divide the other would make them change one for the other, and a child with one slot
    more costs at most one slot-step per tick.
    """
    if shards < 1 or shards > num_envs:
        raise ValueError(f"{num_envs} slot(s) cannot be split over {shards} shard(s): 1 to {num_envs} shards")
    size, extra = divmod(num_envs, shards)
    ranges: list[range] = []
    start = 0
    for shard in range(shards):
        stop = start + size + (1 if shard < extra else 0)
        ranges.append(range(start, stop))
        start = stop
    return ranges


class ShardedProcess:
    """The K children of one sharded instance: spawned together, judged together, stopped together.

    It answers what the pool asks of a :class:`~hud_pipelines.sim.process.SimProcess` (``alive``,
    ``kill``, ``terminate``, ``close``, ``connect``) for all of them at once: the instance is alive
    while every child is, and stopping it stops every child's process group.
    """

    def __init__(self, processes: Sequence[SimProcess], slots: Sequence[range]) -> None:
        self.processes = list(processes)
        self.slots = list(slots)

    @classmethod
    def spawn(
        cls,
        factory: str,
        *,
        num_envs: int,
        shards: int,
        contract_path: Path | None = None,
        **spawn: Any,
    ) -> ShardedProcess:
        """Start ``shards`` children serving ``factory``, each with its slice of the ``num_envs`` slots.

        The children start at the same time (one start-up, not K), except that with a contract file
        the first one starts alone: a child writes the file on first use, and a second child reading
        it while the first writes would read half a file. When one child cannot start, the ones that
        did are stopped and the error names the child.
        """
        slots = split_slots(num_envs, shards)
        started: list[SimProcess | None] = [None] * shards

        def start(shard: int) -> None:
            started[shard] = SimProcess.spawn(factory, num_envs=len(slots[shard]), contract_path=contract_path, **spawn)

        try:
            first = 1 if contract_path is not None else 0
            if first:
                _labelled(start, 0, slots)
            with ThreadPoolExecutor(max_workers=shards, thread_name_prefix="hud-shard-spawn") as pool:
                futures = [pool.submit(_labelled, start, shard, slots) for shard in range(first, shards)]
                failures = [exc for exc in (f.exception() for f in futures) if exc is not None]
            if failures:
                raise failures[0]
        except BaseException:
            for process in started:
                if process is not None:
                    process.close(grace_s=1.0)
            raise
        return cls([p for p in started if p is not None], slots)

    @property
    def owned(self) -> bool:
        return True

    @property
    def pgids(self) -> list[int]:
        """Every child's process group (each child leads its own)."""
        return [p.pgid for p in self.processes if p.pgid is not None]

    @property
    def returncode(self) -> int | None:
        """The exit status of the first child that exited (``None`` while every child runs)."""
        return next((p.returncode for p in self.processes if p.returncode is not None), None)

    def alive(self) -> bool:
        return all(p.alive() for p in self.processes)

    def kill(self) -> None:
        """SIGKILL every child's process group now."""
        for process in self.processes:
            process.kill()

    def terminate(self) -> None:
        for process in self.processes:
            process.terminate()

    def close(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Stop every child: all are told at once, then each is waited for (one grace period, not K)."""
        self.terminate()
        for process in self.processes:
            process.close(grace_s=grace_s)  # counted from its SIGTERM above

    def connect(
        self,
        *,
        framing: Framing | None = Framing.BATCHED,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> ShardedSim:
        """One client over every child; a failure of one child kills them all."""
        clients: list[SimClient] = []
        try:
            for shard, process in enumerate(self.processes):
                try:
                    clients.append(
                        process.connect(
                            framing=framing,
                            step_timeout_s=step_timeout_s,
                            connect_timeout_s=connect_timeout_s,
                            max_frame_bytes=max_frame_bytes,
                        )
                    )
                except (SimError, WireError) as exc:
                    raise shard_error(exc, describe(shard, self.slots[shard], len(self.slots)), 0) from exc
            return ShardedSim(clients, on_failure=self.kill)
        except BaseException:
            for client in clients:
                with contextlib.suppress(Exception):
                    client.close()
            raise


def _labelled(start: Callable[[int], None], shard: int, slots: list[range]) -> None:
    """Run ``start(shard)``; a start-up error names the child."""
    try:
        start(shard)
    except SimStartError as exc:
        raise SimStartError(f"{describe(shard, slots[shard], len(slots))}: {exc}", child_error=exc.child_error) from exc


__all__ = ["ShardedProcess", "split_slots"]
