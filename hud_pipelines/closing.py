"""``Closeable``: a resource that is its own context manager and is closed on the way out.

The sims, clients, pools, recorders and policy wrappers all hold something that must be let go
(a child process, a socket, a thread, open files) and all follow ``io.IOBase``'s rule: ``with x:``
returns ``x`` and calls ``x.close()`` however the block ends, and ``close()`` is safe to call twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Closeable(ABC):
    """``with x:`` closes ``x`` on the way out; subclasses say what ``close`` lets go."""

    __slots__ = ()

    @abstractmethod
    def close(self) -> None:
        """Let go of what the object holds; a second call does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
