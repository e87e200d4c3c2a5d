"""A sink on a thread of its own writes what it would write on the caller's, in the same order, and fails alike."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hud_pipelines.contract import Contract, Feature
from hud_pipelines.recording import events
from hud_pipelines.recording.background import InBackground
from hud_pipelines.recording.contained import ContainedSink
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus
from hud_pipelines.recording.trace_reader import read_trace
from hud_pipelines.recording.traces import TraceRecorder

CONTRACT = Contract(
    control_rate=10,
    features={
        "state": Feature(role="observation", dtype="float32", shape=(3,)),
        "action": Feature(role="action", dtype="float32", shape=(2,)),
    },
)


def _ticks(slots: int, steps: int, *, seed: int = 0) -> list[tuple[events.FrameBatch, events.InferenceBatch]]:
    rng = np.random.default_rng(seed)
    keys = [EpisodeKey("job", "t", 0, slot, 0, 10 + slot) for slot in range(slots)]
    return [
        (
            events.FrameBatch(
                keys=keys,
                index=np.full(slots, step, dtype=np.int64),
                observation={"state": rng.standard_normal((slots, 3)).astype(np.float32)},
                action=rng.standard_normal((slots, 2)).astype(np.float32),
                reward=rng.standard_normal(slots),
                terminated=np.zeros(slots, np.bool_),
                truncated=np.full(slots, step == steps - 1),
                success=rng.random(slots) < 0.5,
            ),
            events.InferenceBatch(
                keys=keys,
                step=np.full(slots, step, dtype=np.int64),
                chunk=rng.standard_normal((slots, 1, 2)).astype(np.float32),
                latency_s=0.001,
                batch_size=slots,
            ),
        )
        for step in range(steps)
    ]


def _record(
    sink: events.EpisodeSink, ticks: list[tuple[events.FrameBatch, events.InferenceBatch]], *, scribble: bool = False
) -> None:
    """Drive ``sink`` as the agent loop does; ``scribble``: overwrite every array once the call returned."""
    keys = ticks[0][0].keys
    for key in keys:
        sink.begin(key, "balance")
    for frames, inferences in ticks:
        sink.add_inferences(inferences)
        sink.add_frames(frames)
        if scribble:
            for array in (frames.action, frames.reward, frames.observation["state"], inferences.chunk):
                array[...] = 0
    for key in keys:
        sink.end(key, EpisodeOutcome(EpisodeStatus.SUCCEEDED, 1.0, True, 2.5, len(ticks), truncated=True))
    sink.close()


def _written(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trace's lines, without its start time."""
    return {str(path.relative_to(root)): read_trace(path).without_timing() for path in sorted(root.rglob("*.jsonl"))}


@pytest.mark.parametrize("slots", [2, 16])
def test_traces_written_on_a_thread_are_the_lines_written_on_the_callers(tmp_path: Path, slots: int) -> None:
    """16 slots are handed to the thread (2 are written at once); a caller that reuses its arrays after each call
    (a policy writing into one output buffer) changes nothing the thread writes."""
    _record(TraceRecorder(tmp_path / "inline", CONTRACT), _ticks(slots, 30))
    _record(InBackground(TraceRecorder(tmp_path / "thread", CONTRACT)), _ticks(slots, 30), scribble=True)
    inline, threaded = _written(tmp_path / "inline"), _written(tmp_path / "thread")
    assert len(inline) == slots
    assert threaded == inline
    assert not [t for t in threading.enumerate() if t.name == "recording"], "close() ends the thread"


class _Slow:
    """A sink whose frames take a while and which fails at its ``fail_at``-th call: it records what it heard."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.heard: list[str] = []
        self.fail_at = fail_at
        self.closed = False

    def _hear(self, what: str) -> None:
        if len(self.heard) == self.fail_at:
            raise OSError(28, "No space left on device")
        self.heard.append(what)

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        self._hear(f"begin {key.slot}")

    def add_frames(self, batch: events.FrameBatch) -> None:
        time.sleep(0.01)
        self._hear(f"frames {int(batch.index[0])}")

    def add_inferences(self, batch: events.InferenceBatch) -> None:
        self._hear(f"inferences {int(batch.step[0])}")

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        self._hear(f"end {key.slot}")

    def close(self) -> None:
        self.closed = True


def test_calls_made_at_once_wait_for_those_queued_before_them() -> None:
    """An episode's end (made at once when nothing is queued) comes after the frames still queued on the thread."""
    slow = _Slow()
    _record(InBackground(slow), _ticks(8, 3))
    said = [f"{kind} {step}" for step in range(3) for kind in ("inferences", "frames")]
    assert slow.heard == [f"begin {s}" for s in range(8)] + said + [f"end {s}" for s in range(8)]
    assert slow.closed


def test_a_failure_on_the_thread_is_the_callers_at_its_next_call_and_the_sink_is_still_closed() -> None:
    """A full disk under the trace writer: the sink hears nothing after, its owner is told (the contained sink keeps
    the reason, the episodes' grades stand), and what was written is closed."""
    slow = _Slow(fail_at=10)
    contained = ContainedSink(InBackground(slow), "traces", "instance t-i0")
    _record(contained, _ticks(8, 6))
    assert len(slow.heard) == 10
    assert contained.failure == "OSError: [Errno 28] No space left on device"
    assert slow.closed
    alone = InBackground(_Slow(fail_at=9))
    with pytest.raises(OSError, match="No space left"):
        _record(alone, _ticks(8, 2))
