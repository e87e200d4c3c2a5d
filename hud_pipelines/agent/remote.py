"""A client of an openpi-style websocket policy server.

The protocol is openpi's ``WebsocketClientPolicy``: connect (with ``Authorization: Api-Key <key>``
when a key is set), read one metadata frame, then for each request send a msgpack-numpy observation
and read ``{"actions": [T, A] | [B, T, A], ...}``. A text frame instead of a reply carries the
server's error traceback.

Frames are encoded by the sims' own codec (:mod:`hud_pipelines.wire.codec`) in its openpi layout:
``{b"__ndarray__": True, b"data", b"dtype", b"shape"}`` with *binary* keys, which is what openpi's
``msgpack_numpy`` writes and reads. Replies are decoded by the same codec (binary or text keys),
which refuses unsafe dtypes, byte counts that do not match the shape and frames of more objects
than their bytes can hold.

openpi servers take one unbatched observation per request, so by default one request is sent per
row (``batched=False``); a server that accepts a leading batch axis gets the whole batch at once.
"""

from __future__ import annotations

import contextlib
import reprlib
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect

from hud_pipelines.agent.policy import Actions, BasePolicy, PolicyBatch, as_chunks
from hud_pipelines.agent.policy_identity import canonical, changed, metadata_identity
from hud_pipelines.closing import Closeable
from hud_pipelines.contract import Contract
from hud_pipelines.errors import PolicyError, PolicyLinkError, PolicyTimeoutError, WireError
from hud_pipelines.sim.fleet import PROBE_EVERY_S, RETURN_GRACE_S
from hud_pipelines.spec.agent import RemotePolicyConfig
from hud_pipelines.spec.problems import did_you_mean
from hud_pipelines.wire.codec import Layout, is_map, packb, unpackb


class RemotePolicy(BasePolicy, Closeable):
    """Sends observations to a policy server and returns its action chunks."""

    def __init__(
        self,
        url: str,
        contract: Contract,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        batched: bool = False,
        rename: Mapping[str, str] | None = None,
        prompt_key: str = "prompt",
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.batched = batched
        self.width = contract.action.size
        features = list(contract.observation_features)
        unknown = [name for name in rename or {} if name not in features]
        if unknown:  # a typo would send the feature under its own name, silently
            raise PolicyError(
                f"remote policy rename names {unknown}, which are not observation features of the contract; "
                f"its features: {features}{did_you_mean(unknown[0], features)}"
            )
        self.keys = {name: dict(rename or {}).get(name, name) for name in features}
        self.prompt_key = prompt_key
        self._lock = threading.Lock()
        """Held by a forward for all its requests: the protocol numbers nothing, so one request at a time."""
        self._state = threading.Lock()
        """Guards the connection and the epoch against :meth:`abandon`, which comes from another thread."""
        self._epoch = 0
        """Bumped by :meth:`abandon`: a forward of an earlier epoch stops at its next request."""
        self._open: ClientConnection | None = None
        """A connection whose metadata frame is being read: not yet the current one, but cut by :meth:`abandon`."""
        self._headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        self._ws: ClientConnection | None = None
        self.metadata: dict[str, Any] = {}
        """What the server says of its policy (its first frame on each connection)."""
        self._held: dict[str, Any] | None = None
        """The identity (:meth:`identity`) every connection's server must have: the policy the run met first."""
        self._served = False
        """Whether a connection ever opened: a server that refuses one only after that may be restarting."""
        self._refused_since: float | None = None
        """When the server that had served refused a connection first."""
        self._connect(self._epoch)

    @classmethod
    def from_config(cls, config: RemotePolicyConfig, contract: Contract) -> RemotePolicy:
        return cls(
            config.url,
            contract,
            api_key=None if config.api_key is None else config.api_key.get_secret_value(),
            timeout_s=config.timeout_s,
            batched=config.batched,
            rename=config.rename,
            prompt_key=config.prompt_key,
        )

    def infer(self, batch: PolicyBatch) -> Actions:
        with self._lock:
            epoch = self._epoch
            if self.batched:
                reply = self._call(self._request(batch.observation, batch.prompts), epoch)
                return as_chunks(reply, batch.size, self.width, source=f"the policy server at {self.url}")
            chunks = [
                self._chunk(
                    self._call(
                        self._request({k: v[row] for k, v in batch.observation.items()}, batch.prompts[row]), epoch
                    )
                )
                for row in range(batch.size)
            ]
        return _stack_chunks(chunks)

    def _chunk(self, reply: npt.NDArray[np.float32]) -> Actions:
        """``[T, A]`` of the reply to one observation (``[A]`` means ``T = 1``), or an error in the server's terms."""
        chunk = reply.reshape(1, -1) if reply.ndim <= 1 else reply
        if chunk.ndim == 2 and chunk.shape[0] >= 1 and chunk.shape[1] == self.width:
            return chunk
        raise PolicyError(
            f"the policy server at {self.url} returned actions of shape {list(reply.shape)} for one observation; "
            f"expected [T, A={self.width}] or [A={self.width}]"
        )

    def identity(self) -> dict[str, Any]:
        """What the server said of its policy, as JSON (:func:`metadata_identity`): a result's provenance holds it, so
        results of another policy served at the same address are never pooled with these."""
        return metadata_identity(self.metadata)

    def hold_to(self, identity: dict[str, Any]) -> None:
        """Refuse a server that says its policy is another than ``identity`` (the run's, which another process may
        have met first), now and on every later connection: a server restarted on its address with other weights
        mid-run fails the forward as a lost server does, rather than answer the rest of the episodes."""
        self._held = identity
        self._refuse_another(self.metadata)

    def _refuse_another(self, metadata: dict[str, Any]) -> None:
        identity = metadata_identity(metadata)
        if self._held is None or canonical(identity) == canonical(self._held):
            return
        raise PolicyLinkError(
            f"the policy server at {self.url} serves another policy than this run's: what it says of its policy "
            f"{changed(self._held, identity)}"
        )

    def close(self) -> None:
        """Close the connection with a close frame; a later forward opens a new one."""
        with self._state:
            self._epoch += 1
            ws, self._ws = self._ws, None
        self._drop(ws)

    def abandon(self) -> None:
        """Cut short a forward that was given up on, from another thread: its read ends at once, and it stops
        before its next request, so the next forward (waiting for the lock it holds) need not wait out
        ``timeout_s``; that one connects anew, where no late reply of the abandoned request can be taken for
        its own. A TCP or HTTP handshake under way is not cut: ``timeout_s`` bounds it."""
        with self._state:
            self._epoch += 1
            cut = [ws for ws in (self._ws, self._open) if ws is not None]
            self._ws = None
        for ws in cut:
            with contextlib.suppress(OSError):
                ws.socket.shutdown(socket.SHUT_RDWR)

    # -- plumbing ------------------------------------------------------------------------------------

    def _request(self, observation: Mapping[str, npt.NDArray[Any]], prompt: str | list[str]) -> dict[str, Any]:
        request: dict[str, Any] = {self.keys.get(k, k): np.asarray(v) for k, v in observation.items()}
        request[self.prompt_key] = prompt
        return request

    def _connect(self, epoch: int) -> ClientConnection:
        """Open the connection and read its metadata frame (what the server says of its policy); it becomes the
        current one unless :meth:`abandon` came meanwhile."""
        while True:
            try:
                ws = connect(
                    self.url,
                    additional_headers=self._headers,
                    compression=None,
                    max_size=None,
                    open_timeout=self.timeout_s,
                    ping_interval=None,  # a busy server may not answer pings; timeout_s bounds every call
                    legacy=True,
                )
                break
            except InvalidStatus as exc:
                raise PolicyLinkError(
                    f"the policy server at {self.url} refused the connection: HTTP {exc.response.status_code}"
                ) from exc
            except (OSError, TimeoutError, WebSocketException) as exc:
                if not self._may_return(exc, epoch):
                    raise PolicyLinkError(f"cannot connect to the policy server at {self.url}: {exc}") from exc
        self._served, self._refused_since = True, None
        try:
            with self._state:
                self._open = ws
            self._given_up(epoch)
            said = self._receive(ws, "the metadata frame")
            metadata: dict[str, Any] = said if is_map(said) else {"metadata": said}
            self._refuse_another(metadata)
            with self._state:
                self._open = None
                if epoch == self._epoch:
                    self._ws = ws
            self._given_up(epoch)
        except BaseException as exc:
            self._drop(ws)
            if isinstance(exc, PolicyTimeoutError):  # a server that never says what it serves is unusable
                raise PolicyLinkError(str(exc)) from exc
            raise
        self.metadata = metadata
        return ws

    def _may_return(self, exc: BaseException, epoch: int) -> bool:
        """Whether to connect again: a server that served this policy and now refuses connections is given
        :data:`RETURN_GRACE_S` from its first refusal to listen again (a restart on its address), as a served sim
        is; after that, each forward fails at once until it is back. A server never reached is not waited for."""
        if not isinstance(exc, ConnectionRefusedError) or not self._served:
            return False
        now = time.monotonic()
        self._refused_since = now if self._refused_since is None else self._refused_since
        if now - self._refused_since >= RETURN_GRACE_S:
            return False
        time.sleep(PROBE_EVERY_S)
        self._given_up(epoch)
        return True

    def _given_up(self, epoch: int) -> None:
        """Stop a forward that :meth:`abandon` gave up on (its result is thrown away)."""
        if epoch != self._epoch:
            raise PolicyLinkError(f"the forward was given up on; its connection to {self.url} was cut")

    def _call(self, request: dict[str, Any], epoch: int) -> npt.NDArray[np.float32]:
        """One request and its reply. The protocol numbers nothing, so a call that did not read its own reply
        (a timeout, an error frame, a broken frame) leaves the connection one reply behind: it is dropped, and
        the next call opens a new one, rather than take the late reply of this one for its own."""
        self._given_up(epoch)
        if (idle := self._ws) is not None and idle.protocol.state is not State.OPEN:
            self._drop(idle)  # its server closed it since the last reply (a restart, a proxy's idle timeout)
        ws = self._ws or self._connect(epoch)  # its own reference: abandon() may clear the attribute meanwhile
        try:
            try:
                ws.send(packb(request, Layout.OPENPI))
            except (ConnectionClosed, OSError) as exc:
                raise PolicyLinkError(f"the policy server at {self.url} went away: {exc}") from exc
            reply = self._receive(ws, "an inference reply")
        except BaseException:
            self._drop(ws)
            raise
        if not is_map(reply) or "actions" not in reply:
            keys = sorted(map(str, reply)) if is_map(reply) else type(reply).__name__
            raise PolicyError(f"the policy server at {self.url} replied without 'actions' (got {keys})")
        try:
            return np.asarray(reply["actions"], dtype=np.float32)
        except (TypeError, ValueError):
            width = self.width
            expected = f"[B, T, A={width}]" if self.batched else f"[T, A={width}] or [A={width}]"
            raise PolicyError(
                f"the policy server at {self.url} replied with 'actions' that are no array of numbers "
                f"({reprlib.repr(reply['actions'])}); expected {expected}"
            ) from None

    def _receive(self, ws: ClientConnection, what: str) -> Any:
        try:
            frame = ws.recv(timeout=self.timeout_s)
        except TimeoutError as exc:
            raise PolicyTimeoutError(
                f"the policy server at {self.url} did not send {what} within {self.timeout_s:g} s (timeout_s)",
                deadline_s=self.timeout_s,
            ) from exc
        except (ConnectionClosed, OSError) as exc:
            raise PolicyLinkError(
                f"the policy server at {self.url} went away while we waited for {what}: {exc}"
            ) from exc
        if isinstance(frame, str):  # headed by the exception a traceback ends with (a report shows one line)
            whole = f"\n{frame}" if len(frame.strip().splitlines()) > 1 else ""
            raise PolicyError(f"the policy server at {self.url} reported an error: {_headline(frame)}{whole}")
        try:
            return unpackb(frame)
        except WireError as exc:
            raise PolicyError(f"the policy server at {self.url} sent a malformed frame: {exc}") from exc

    def _drop(self, ws: ClientConnection | None) -> None:
        """Close ``ws``, and forget it when it is the current connection."""
        with self._state:
            if ws is self._ws:
                self._ws = None
            if ws is self._open:
                self._open = None
        if ws is not None:
            with contextlib.suppress(OSError, WebSocketException):
                ws.close()


def _stack_chunks(chunks: list[Actions]) -> Actions:
    lengths = {c.shape[0] for c in chunks}
    if len(lengths) > 1:  # rows with different chunk lengths: keep the common prefix
        shortest = min(lengths)
        chunks = [c[:shortest] for c in chunks]
    return np.stack(chunks).astype(np.float32, copy=False)


def _headline(text: str) -> str:
    """A policy server's error in one line: the exception line after a Python traceback's last frame (its first
    line, where the message has several), else the text's last line."""
    lines = [line for line in text.splitlines() if line.strip()]
    frames = [index for index, line in enumerate(lines) if line.startswith("  File ")]
    after = lines[frames[-1] + 1 :] if frames else []
    exception = next((line for line in after if not line.startswith(" ")), None)
    return (exception or (lines[-1] if lines else "(no text)")).strip()
