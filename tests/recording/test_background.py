"""A sink on a thread of its own writes what it would write on the caller's, in the same order, and fails alike."""

from __future__ import annotations

import signal
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
from hud_pipelines.recording.events import EpisodeKey, EpisodeOutcome, EpisodeStatus, FrameBatch
from hud_pipelines.recording.events import InferenceBatch as Inference
from hud_pipelines.recording.trace_reader import read_trace
from hud_pipelines.recording.traces import TraceRecorder

CONTRACT = Contract(
    control_rate=10,
    features={
        "state": Feature(role="observation", dtype="float32", shape=(3,)),
        "action": Feature(role="action", dtype="float32", shape=(2,)),
    },
)


def _ticks(slots: int, steps: int, *, last: int | None = None, seed: int = 0) -> list[tuple[FrameBatch, Inference]]:
    """``steps`` ticks of ``slots`` slots; from tick ``last`` on, only the first three slots still run (the others'
    episodes ended): small ticks behind large ones."""
    rng = np.random.default_rng(seed)
    every = [EpisodeKey("job", "t", 0, slot, 0, 10 + slot) for slot in range(slots)]
    ticks: list[tuple[FrameBatch, Inference]] = []
    for step in range(steps):
        keys = every if last is None or step < last else every[:3]
        n = len(keys)
        frames = FrameBatch(
            keys=keys,
            index=np.full(n, step, dtype=np.int64),
            observation={"state": rng.standard_normal((n, 3)).astype(np.float32)},
            action=rng.standard_normal((n, 2)).astype(np.float32),
            reward=rng.standard_normal(n),
            terminated=np.zeros(n, np.bool_),
            truncated=np.full(n, step == steps - 1),
            success=rng.random(n) < 0.5,
        )
        chunk = rng.standard_normal((n, 1, 2)).astype(np.float32)
        ticks.append(
            (frames, Inference(keys=keys, step=frames.index.copy(), chunk=chunk, latency_s=0.001, batch_size=n))
        )
    return ticks


def _record(sink: events.EpisodeSink, ticks: list[tuple[FrameBatch, Inference]]) -> None:
    """Drive ``sink`` as the agent loop does."""
    keys = ticks[0][0].keys
    for key in keys:
        sink.begin(key, "balance")
    for frames, inferences in ticks:
        sink.add_inferences(inferences)
        sink.add_frames(frames)
    for key in keys:
        sink.end(key, EpisodeOutcome(EpisodeStatus.SUCCEEDED, 1.0, True, 2.5, len(ticks), truncated=True))
    sink.close()


def _written(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trace's lines, without its start time."""
    return {str(path.relative_to(root)): read_trace(path).without_timing() for path in sorted(root.rglob("*.jsonl"))}


@pytest.mark.parametrize(("slots", "last"), [(2, None), (16, None), (16, 20)])
def test_traces_written_on_a_thread_are_the_lines_written_on_the_callers(
    tmp_path: Path, slots: int, last: int | None
) -> None:
    """16 slots are handed to the thread, 2 are written at once, and ticks of 3 after ticks of 16 queue behind them."""
    _record(TraceRecorder(tmp_path / "inline", CONTRACT), _ticks(slots, 30, last=last))
    _record(InBackground(TraceRecorder(tmp_path / "thread", CONTRACT)), _ticks(slots, 30, last=last))
    inline, threaded = _written(tmp_path / "inline"), _written(tmp_path / "thread")
    assert len(inline) == slots
    assert threaded == inline
    assert not [t for t in threading.enumerate() if t.name == "recording"], "close() ends the thread"


class _Slow:
    """A sink whose frames take a while and which fails at its ``fail_at``-th call: it logs every call it gets."""

    def __init__(self, fail_at: int | None = None, gate: threading.Event | None = None) -> None:
        self.heard: list[str] = []
        self.fail_at = fail_at
        self.gate = gate
        self.closed: list[str] = []

    def _hear(self, what: str) -> None:
        self.heard.append(what)
        if len(self.heard) == self.fail_at:
            raise OSError(28, "No space left on device")

    def begin(self, key: EpisodeKey, prompt: str) -> None:
        self._hear(f"begin {key.slot}")

    def add_frames(self, batch: FrameBatch) -> None:
        if self.gate is not None:
            self.gate.wait()
        time.sleep(0.01)
        self._hear(f"frames {int(batch.index[0])}")

    def add_inferences(self, batch: Inference) -> None:
        self._hear(f"inferences {int(batch.step[0])}")

    def end(self, key: EpisodeKey, outcome: EpisodeOutcome) -> None:
        self._hear(f"end {key.slot}")

    def close(self) -> None:
        self.closed.append(f"after {len(self.heard)} calls, on {threading.current_thread().name}")


def test_calls_made_at_once_wait_for_those_queued_before_them() -> None:
    """An episode's end (made at once when nothing is queued) comes after the frames still queued on the thread."""
    slow = _Slow()
    _record(InBackground(slow), _ticks(8, 3))
    said = [f"{kind} {step}" for step in range(3) for kind in ("inferences", "frames")]
    assert slow.heard == [f"begin {s}" for s in range(8)] + said + [f"end {s}" for s in range(8)]
    assert slow.closed == [f"after {len(slow.heard)} calls, on MainThread"]


def test_a_failure_on_the_thread_is_the_callers_at_its_next_call_and_the_sink_hears_nothing_after() -> None:
    """A full disk under the trace writer: the sink hears nothing after, its owner is told (the contained sink keeps
    the reason, the episodes' grades stand), and what was written is closed."""
    slow = _Slow(fail_at=10)
    contained = ContainedSink(InBackground(slow), "traces", "instance t-i0")
    _record(contained, _ticks(8, 6))
    assert len(slow.heard) == 10, slow.heard
    assert contained.failure == "OSError: [Errno 28] No space left on device"
    assert slow.closed == ["after 10 calls, on MainThread"]
    alone = InBackground(_Slow(fail_at=10))
    with pytest.raises(OSError, match="No space left"):
        _record(alone, _ticks(8, 2))


def test_a_close_interrupted_while_it_waits_leaves_the_next_close_to_wait_and_close_the_sink_after() -> None:
    """Ctrl-C while close() waited on the thread: it forgot the thread, so a second close() closed the sink while
    the thread still wrote into it."""
    gate = threading.Event()
    slow = _Slow(gate=gate)
    sink = InBackground(slow)
    frames, inferences = _ticks(8, 1)[0]
    sink.add_inferences(inferences)
    sink.add_frames(frames)  # the thread waits at the gate with these frames
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            sink.close()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert slow.closed == [], "not under the thread's feet"
    gate.set()
    sink.close()
    assert slow.heard == ["inferences 0", "frames 0"]
    assert slow.closed == ["after 2 calls, on MainThread"]


def test_a_thread_that_cannot_start_fails_the_call_and_the_sink_is_still_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow = _Slow()
    sink = InBackground(slow)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    frames, _ = _ticks(8, 1)[0]
    with pytest.raises(RuntimeError, match="can't start new thread"):
        sink.add_frames(frames)
    sink.close()
    assert slow.closed == ["after 0 calls, on MainThread"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def test_what_waits_for_the_thread_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sink slower than the loop (a camera's video on a slow disk) held every tick queued to it: 64 ticks of two
    480x640 cameras at 32 slots are 3.5 GiB. The caller now waits once the queued arrays reach the budget."""
    from hud_pipelines.recording import background

    monkeypatch.setattr(background, "QUEUED_BYTES", 200)  # a tick of 8 slots: frames 160 bytes, inferences 64
    gate = threading.Event()
    slow = _Slow(gate=gate)
    sink = InBackground(slow)
    ticks = _ticks(8, 3)

    def record() -> None:
        for frames, inferences in ticks:
            sink.add_inferences(inferences)
            sink.add_frames(frames)

    producer = threading.Thread(target=record)
    producer.start()
    producer.join(timeout=0.5)
    assert producer.is_alive(), "the second tick waits while the first one's frames are queued"
    assert slow.heard == ["inferences 0"]
    gate.set()
    producer.join(timeout=30)
    assert not producer.is_alive()
    sink.close()
    assert slow.heard == [f"{kind} {step}" for step in range(3) for kind in ("inferences", "frames")]
