"""One connection's protocol from the client's side, sans I/O: requests out as bytes, replies in.

A :class:`ClientSession` knows what the protocol says about a connection from the client's end and
nothing about sockets, threads or deadlines:

- the handshake: the ``hello`` frame to send, and the server's answer checked (an ``error`` frame
  there is a :class:`~hud_pipelines.errors.RemoteError` and leaves the session broken);
- sequence numbers: every request gets the next one;
- pending replies: the server answers in request order, so each reply must carry the ``seq`` of the
  oldest request still waiting (an ``error`` frame may carry none); a reply read while waiting for
  a later request is kept until its caller asks (pipelined steps);
- the broken state: after a reply that breaks these rules, or once the I/O layer reports a crash or
  a missed deadline (:meth:`fail`), a late reply could be taken for the answer to the next request,
  so every later request is refused at once;
- the sim's word: once told the contract's observation features (:meth:`hold_to`), every observation
  must carry exactly those features with the contract's dtype and per-slot shape, and a NaN or infinity
  in a running slot's observation or reward must be flagged (``errors``) as the protocol asks. A
  server written elsewhere that does neither is not trusted on the rest: its frame breaks the session,
  so its episodes end as errored instead of graded on values nobody checked.

The I/O shell (:class:`~hud_pipelines.sim.client.SimClient`) moves the bytes, applies deadlines and
turns transport failures into typed sim errors; this class is what the shell and a test can reason
about without a server.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

import numpy as np

from hud_pipelines.errors import RemoteError, SimContractError, SimError, WireError
from hud_pipelines.wire import messages
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import ErrorFrame, Framing, Observation, Reply, Result, ServerHello, SessionState
from hud_pipelines.wire.parse import parse_reply


class ClientSession:
    """The client's protocol state of one connection; ``framing`` is asked for in the hello (``None``:
    the server chooses)."""

    def __init__(self, framing: Framing | None = Framing.BATCHED, *, peer: str = "the sim") -> None:
        self.requested_framing = framing
        self.peer = peer
        """Who is at the other end, for error messages (the sim's URL)."""
        self.state = SessionState.HANDSHAKE
        self.broken: str | None = None
        """Why the session can no longer be used (``None`` while it can)."""
        self._hello: ServerHello | None = None
        self._seq = itertools.count(1)
        self._pending: collections.deque[int] = collections.deque()
        """Sequence numbers sent whose replies have not been read, oldest first."""
        self._arrived: dict[int, Reply] = {}
        """Replies read while waiting for a later request, until their caller asks."""
        self._features: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] | None = None
        """The contract's observation features, ``{name: (dtype, per-slot shape)}``, once :meth:`hold_to` said."""
        self._floats: tuple[str, ...] = ()
        """Those of them that can hold a NaN or infinity."""

    # -- handshake ---------------------------------------------------------------------------------

    def hello(self) -> bytes:
        """The first frame to send."""
        return packb(
            messages.to_wire(messages.Hello(protocol=messages.PROTOCOL_VERSION, framing=self.requested_framing))
        )

    def receive_hello(self, frame: bytes | bytearray | memoryview | str) -> ServerHello:
        """Take the server's answer to the hello; the session serves from here on."""
        try:
            hello = parse_reply(unpackb(frame), Framing.BATCHED, None)
        except WireError as exc:  # another kind of server at the address (a policy server) answers so too
            self.fail(f"undecodable reply during handshake: {exc}")
            raise WireError(
                f"{self.peer} answered the handshake with a frame that is no sim's hello ({exc}): is it a sim served "
                "by `hud-pipelines serve` of this version, or another kind of server (a policy server)?"
            ) from exc
        if isinstance(hello, ErrorFrame):
            self.fail(hello.message)
            raise RemoteError(hello.message, phase=hello.phase)
        if not isinstance(hello, ServerHello):
            raise self._break(f"expected a hello frame from the sim, got {type(hello).__name__}")
        self._hello = hello
        self.state = SessionState.SERVING
        return hello

    @property
    def server_hello(self) -> ServerHello:
        if self._hello is None:
            raise SimError("the handshake has not finished")
        return self._hello

    def hold_to(self, features: dict[str, tuple[str, tuple[int, ...]]]) -> None:
        """Check every later observation against the contract's observation features (``{name: (dtype,
        per-slot shape)}``, as the hello's contract gives them)."""
        self._features = {name: (np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in features.items()}
        self._floats = tuple(name for name, (dtype, _) in self._features.items() if dtype.kind == "f")

    @property
    def num_envs(self) -> int:
        return self.server_hello.num_envs

    # -- requests ----------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]]) -> tuple[int, bytes]:
        """``(seq, frame)`` of a reset with one task per slot."""
        if len(tasks) != self.num_envs:
            raise SimError(f"reset needs one task per slot: {self.num_envs} slots, {len(tasks)} tasks")
        return self._post(messages.Reset(seq=self._next(), tasks=tasks))

    def step(self, action: Any) -> tuple[int, bytes]:
        """``(seq, frame)`` of a step with an ``[N, A]`` action (an ``[A]`` row for a single slot)."""
        array = np.asarray(action)
        if self.num_envs == 1 and array.ndim <= 1:
            array = array.reshape(1, -1)
        return self._post(messages.Step(seq=self._next(), action=array))

    def result(self) -> tuple[int, bytes]:
        """``(seq, frame)`` of a result request."""
        return self._post(messages.ResultRequest(seq=self._next()))

    def close(self) -> bytes | None:
        """The goodbye frame to send (``None`` once broken: there is nobody to say it to); ends the session."""
        frame = packb(messages.to_wire(messages.Close())) if self.broken is None else None
        self.fail("the client was closed")
        return frame

    # -- replies -----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests sent whose replies nobody has read yet (pipelined steps)."""
        return len(self._pending) + len(self._arrived)

    @property
    def usable(self) -> bool:
        return self.broken is None

    def take(self, seq: int) -> Reply | None:
        """The reply to request ``seq`` if it arrived (``None``: read another frame and :meth:`receive` it).

        An ``error`` frame answering ``seq`` is raised as :class:`RemoteError`; the session stays usable.
        """
        if seq in self._arrived:
            reply = self._arrived.pop(seq)
            if isinstance(reply, ErrorFrame):
                raise _remote_error(reply)
            return reply
        self.require_usable()
        if seq not in self._pending:
            raise SimError(f"no request numbered {seq} is waiting for a reply from {self.peer}")
        return None

    def receive(self, frame: bytes | bytearray | memoryview | str) -> None:
        """Take one reply frame: it answers the oldest request still waiting, or it breaks the session."""
        self.require_usable()
        if not self._pending:
            raise self._break("a reply arrived while no request was waiting")
        try:
            hello = self.server_hello
            reply = parse_reply(unpackb(frame), hello.framing, hello.num_envs)
        except WireError as exc:
            self.fail(f"undecodable reply: {exc}")
            raise
        expected = self._pending[0]
        reply_seq = getattr(reply, "seq", None)
        if isinstance(reply, ErrorFrame) and reply_seq not in (None, expected):
            raise self._break(f"error frame for request {reply_seq} while waiting for {expected}")
        if not isinstance(reply, ErrorFrame) and reply_seq != expected:
            raise self._break(f"reply numbered {reply_seq} to request {expected}: late or out-of-order reply")
        if isinstance(reply, Observation) and self._features is not None:
            self._check(reply, self._features)
        self._pending.popleft()
        self._arrived[expected] = reply

    def expect[R: Observation | Result](self, reply: Reply, kind: type[R]) -> R:
        """``reply`` as the kind its request asked for; anything else breaks the session."""
        if not isinstance(reply, kind):
            raise self._break(f"expected a {kind.__name__} reply, got {type(reply).__name__}")
        return reply

    # -- the broken state --------------------------------------------------------------------------

    def fail(self, reason: str) -> None:
        """The transport failed (a crash, a missed deadline) or the session ended: refuse every later request."""
        self.broken = self.broken or reason
        self.state = SessionState.CLOSED

    def require_usable(self) -> None:
        if self.broken is not None:
            raise SimError(f"the connection to {self.peer} is unusable: {self.broken}")

    def _break(self, message: str) -> WireError:
        """The server broke the protocol: this connection can no longer be trusted."""
        self.fail(message)
        return WireError(message)

    def _check(self, reply: Observation, features: dict[str, tuple[np.dtype[Any], tuple[int, ...]]]) -> None:
        """The sim's observation as its contract says, and its non-finite values flagged (the usual frame:
        a dtype and a shape compared per feature, one ``isfinite`` per float feature and the reward)."""
        observation = reply.observation
        if observation.keys() != features.keys():
            missing, extra = sorted(features.keys() - observation.keys()), sorted(observation.keys() - features)
            raise self._breach(f"observation features {missing} missing, {extra} not in the contract")
        for name, (dtype, shape) in features.items():
            array = observation[name]
            if array.dtype != dtype or array.shape[1:] != shape:
                raise self._breach(
                    f"observation feature {name!r} came as {array.dtype} {list(array.shape[1:])} per slot; "
                    f"the contract says {dtype} {list(shape)}"
                )
        if _finite(reply.reward) and all(_finite(observation[name]) for name in self._floats):
            return
        # a slot that ended keeps its last row (a non-finite one too); one flagged in this frame ends now
        count = len(reply.status)
        live = np.fromiter((status in ("running", "done") for status in reply.status), np.bool_, count)
        live[[slot for slot in {*reply.nonfinite, *(error.slot for error in reply.errors)} if 0 <= slot < count]] = (
            False
        )
        for name, values in (("reward", reply.reward), *((name, observation[name]) for name in self._floats)):
            unflagged = np.flatnonzero(live & ~np.isfinite(values.reshape(count, -1)).all(axis=1))
            if unflagged.size:
                slot = int(unflagged[0])
                raise self._break(
                    f"the sim at {self.peer} sent slot {slot} as {reply.status[slot]} with a non-finite {name} it did "
                    "not flag (a NaN or infinity ends its slot, named in 'errors': protocol 6.7)"
                )

    def _breach(self, message: str) -> SimContractError:
        """The sim's frame does not fit the contract it announced: this connection can no longer be trusted."""
        self.fail(message)
        return SimContractError(f"the sim at {self.peer} broke its contract: {message}")

    def _next(self) -> int:
        return next(self._seq)

    def _post(self, request: messages.Reset | messages.Step | messages.ResultRequest) -> tuple[int, bytes]:
        self.require_usable()
        framing = self.server_hello.framing
        frame = packb(
            messages.to_wire(
                request, framing if isinstance(request, messages.Reset | messages.Step) else Framing.BATCHED
            )
        )
        self._pending.append(request.seq)
        return request.seq, frame


def _finite(values: np.ndarray[Any, Any]) -> bool:
    """Whether every value is finite (``count_nonzero`` is a third of ``ndarray.all``'s cost on a small array)."""
    return np.count_nonzero(np.isfinite(values)) == values.size


def _remote_error(e: ErrorFrame) -> RemoteError:
    """What a client raises for an ``error`` frame that answers its request."""
    return RemoteError(e.message, phase=e.phase, slot=e.slot, remote_traceback=e.traceback, cause=e.cause)
