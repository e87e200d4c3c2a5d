"""A client of an openpi-style websocket policy server.

The protocol is openpi's ``WebsocketClientPolicy``: connect (with ``Authorization: Api-Key <key>``
when a key is set), read one metadata frame, then for each request send a msgpack-numpy observation
and read ``{"actions": [T, A] | [B, T, A], ...}``. A text frame instead of a reply carries the
server's error traceback.

Arrays travel in openpi's layout, ``{b"__ndarray__": True, b"data", b"dtype", b"shape"}`` with
*binary* keys, which is what openpi's ``msgpack_numpy`` writes and reads; replies are accepted with
binary or text keys and decoded by :func:`hud_pipelines.wire.codec.decode_array`, which refuses
unsafe dtypes and byte counts that do not match the shape.

openpi servers take one unbatched observation per request, so by default one request is sent per
row (``batched=False``); a server that accepts a leading batch axis gets the whole batch at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any, cast

import msgpack
import numpy as np
import numpy.typing as npt
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from hud_pipelines.agent.policy import Actions, BasePolicy, PolicyBatch, as_chunks
from hud_pipelines.contract import Contract
from hud_pipelines.errors import PolicyError, WireError
from hud_pipelines.spec.agent import RemotePolicyConfig
from hud_pipelines.wire.codec import check_dtype, decode_array

NDARRAY = b"__ndarray__"
NPGENERIC = b"__npgeneric__"


class RemotePolicy(BasePolicy):
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
        self.keys = {name: dict(rename or {}).get(name, name) for name in contract.observation_features}
        self.prompt_key = prompt_key
        self._lock = threading.Lock()
        headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        try:
            self._ws: ClientConnection = connect(
                url,
                additional_headers=headers,
                compression=None,
                max_size=None,
                open_timeout=timeout_s,
                ping_interval=None,  # a busy server may not answer pings; timeout_s bounds every call
                legacy=True,
            )
        except InvalidStatus as exc:
            raise PolicyError(
                f"the policy server at {url} refused the connection: HTTP {exc.response.status_code}"
            ) from exc
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise PolicyError(f"cannot connect to the policy server at {url}: {exc}") from exc
        metadata = self._receive("the metadata frame")
        self.metadata: dict[str, Any] = metadata if isinstance(metadata, dict) else {"metadata": metadata}  # pyright: ignore[reportUnknownVariableType]

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
            if self.batched:
                reply = self._call(self._request(batch.observation, batch.prompts))
                return as_chunks(reply, batch.size, self.width, source=f"the policy server at {self.url}")
            chunks = [
                as_chunks(
                    self._call(self._request({k: v[row] for k, v in batch.observation.items()}, batch.prompts[row]))[
                        None
                    ],
                    1,
                    self.width,
                    source=f"the policy server at {self.url}",
                )[0]
                for row in range(batch.size)
            ]
        return _stack_chunks(chunks)

    def close(self) -> None:
        with contextlib.suppress(OSError, WebSocketException):
            self._ws.close()

    def __enter__(self) -> RemotePolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------------

    def _request(self, observation: Mapping[str, npt.NDArray[Any]], prompt: str | list[str]) -> dict[str, Any]:
        request: dict[str, Any] = {self.keys.get(k, k): np.asarray(v) for k, v in observation.items()}
        request[self.prompt_key] = prompt
        return request

    def _call(self, request: dict[str, Any]) -> npt.NDArray[np.float32]:
        try:
            self._ws.send(pack_openpi(request))
        except (ConnectionClosed, OSError) as exc:
            raise PolicyError(f"the policy server at {self.url} went away: {exc}") from exc
        reply = self._receive("an inference reply")
        if not isinstance(reply, dict) or "actions" not in reply:
            keys = sorted(map(str, reply)) if isinstance(reply, dict) else type(reply).__name__  # pyright: ignore[reportUnknownArgumentType]
            raise PolicyError(f"the policy server at {self.url} replied without 'actions' (got {keys})")
        return np.asarray(reply["actions"], dtype=np.float32)

    def _receive(self, what: str) -> Any:
        try:
            frame = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError as exc:
            raise PolicyError(f"the policy server at {self.url} sent no {what} within {self.timeout_s:g} s") from exc
        except (ConnectionClosed, OSError) as exc:
            raise PolicyError(f"the policy server at {self.url} went away while we waited for {what}: {exc}") from exc
        if isinstance(frame, str):
            raise PolicyError(f"the policy server at {self.url} reported an error:\n{frame}")
        try:
            return unpack_openpi(frame)
        except WireError as exc:
            raise PolicyError(f"the policy server at {self.url} sent a malformed frame: {exc}") from exc


def _stack_chunks(chunks: list[Actions]) -> Actions:
    lengths = {c.shape[0] for c in chunks}
    if len(lengths) > 1:  # rows with different chunk lengths: keep the common prefix
        shortest = min(lengths)
        chunks = [c[:shortest] for c in chunks]
    return np.stack(chunks).astype(np.float32, copy=False)


# ---------------------------------------------------------------------------------------------
# openpi's msgpack-numpy layout (binary keys)


def _pack_default(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        array = cast(npt.NDArray[Any], obj)
        dtype = check_dtype(array.dtype)
        return {
            NDARRAY: True,
            b"data": np.ascontiguousarray(array).tobytes(),
            b"dtype": dtype.str,
            b"shape": list(array.shape),
        }
    if isinstance(obj, np.generic):
        scalar = cast(np.generic[Any], obj)
        item: Any = scalar.item()
        return {NPGENERIC: True, b"data": item, b"dtype": check_dtype(scalar.dtype).str}
    if isinstance(obj, tuple):
        return list(cast(tuple[Any, ...], obj))
    raise WireError(f"cannot encode a value of type {type(obj).__name__}")


def _unpack_hook(obj: dict[Any, Any]) -> object:
    if NDARRAY in obj or "__ndarray__" in obj:
        return decode_array({k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()})
    if NPGENERIC in obj or "__npgeneric__" in obj:
        fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}
        return check_dtype(fields.get("dtype", "<missing>")).type(fields.get("data"))
    return obj


def pack_openpi(message: object) -> bytes:
    """Encode ``message`` the way openpi's ``msgpack_numpy.Packer`` does."""
    try:
        packed: bytes = cast(bytes, msgpack.packb(message, default=_pack_default, use_bin_type=True))
        return packed
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode a policy request: {exc}") from exc


def unpack_openpi(frame: bytes | bytearray | memoryview) -> Any:
    """Decode a frame in openpi's layout (binary or text keys); malformed input is a :class:`WireError`."""
    try:
        return cast(Any, msgpack.unpackb(frame, object_hook=_unpack_hook, raw=False, strict_map_key=False))
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise WireError(f"malformed msgpack frame ({type(exc).__name__}: {exc})") from exc
