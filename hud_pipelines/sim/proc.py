"""What ``/proc`` says of a spawned sim's processes: their state and parents, and which carry the sim's mark.

Stopping a sim signals its process group; the processes it started in sessions of their own are found here
(:func:`descendants`) to be stopped by their ids. It is apart from :mod:`hud_pipelines.sim.process`, which
starts and stops the child, because reading the process table is a concern of its own (a run's overlap check
reads it too).
"""

from __future__ import annotations

import contextlib
import os

MARK_ENV = "HUD_PIPELINES_SIM_MARK"
"""Set to a value of its own in a spawned sim's environment: the processes it starts inherit it, and those that
left its process tree (a daemon by a double fork) are found by it when the sim is stopped."""


def proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the process's name (state, ppid, pgrp, ...), or ``None`` when
    there is no such process (or no ``/proc``). The name may hold spaces and ")": it is cut at the last one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def descendants(root: int | None, mark: str | None = None, *, group: int | None = None) -> list[int]:
    """Every living process below ``root`` outside its process group (the group's signal reaches the others),
    and every one whose environment carries the sim's ``mark`` (:data:`MARK_ENV`): a daemon started by a double
    fork has lost its link to ``root`` (init adopted it), not the environment it inherited. Read from ``/proc``
    (none where there is no ``/proc``). Only those are kept to be killed by their id later, so an id the system
    reuses meanwhile is rarely one of them. ``root=None``: a child that exited (and was reaped: its id may be
    another process's now) is no root to walk from; only the mark finds what it started. ``group``: the process
    group whose signal reaches its members, left out (default ``root``'s own: a spawned sim leads its group)."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    marked: list[int] = []
    entry_of_mark = None if mark is None else f"\0{MARK_ENV}={mark}\0".encode()
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            fields = proc_stat(int(entry.name))
            if fields is None:  # it exited while we looked
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            groups[int(entry.name)] = int(fields[2])
            if entry_of_mark is not None and entry_of_mark in b"\0" + _environment(entry.path):
                marked.append(int(entry.name))
    found: list[int] = []
    below = [] if root is None else [root]
    while below:
        for child in children.get(below.pop(), []):
            found.append(child)
            below.append(child)
    signalled = root if group is None else group
    return [pid for pid in dict.fromkeys([*found, *marked]) if groups.get(pid) != signalled]


def _environment(proc_dir: str) -> bytes:
    """A process's environment as ``/proc`` holds it (``NAME=value\\0`` each), empty where it cannot be read
    (another user's process, one that exited)."""
    try:
        with open(f"{proc_dir}/environ", "rb") as environ:
            return environ.read()
    except OSError:
        return b""
