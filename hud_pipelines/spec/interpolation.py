"""Explicit environment-variable interpolation in YAML strings: ``${VAR}`` and ``${VAR:-default}``.

Nothing else is expanded (no ``$VAR``, no ``~``, no templating), so a value means what it says
unless it spells out a reference. ``$${`` writes a literal ``${``. As in a POSIX shell,
``${VAR:-default}`` uses the default when the variable is unset or empty, and ``${VAR}`` of a set
but empty variable is the empty string. A reference to an unset variable without a default is an
error naming the variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_TOKEN = re.compile(r"\$\$\{|\$\{")
_REFERENCE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}$]*))?")


@dataclass(frozen=True)
class InterpolationError:
    """A reference that could not be expanded; ``offset`` and ``length`` locate it in the string."""

    message: str
    offset: int
    length: int


def interpolate(text: str, env: Mapping[str, str]) -> tuple[str, list[InterpolationError]]:
    """Expand every reference in ``text``; failed references are left as written and reported."""
    out: list[str] = []
    errors: list[InterpolationError] = []
    position = 0
    for token in _TOKEN.finditer(text):
        start = token.start()
        if start < position:
            continue
        out.append(text[position:start])
        if token.group() == "$${":
            out.append("${")
            position = token.end()
            continue
        close = text.find("}", token.end())
        if close < 0:
            errors.append(
                InterpolationError(
                    "unterminated '${': write ${VAR} or ${VAR:-default} (or $${ for a literal '${')",
                    start,
                    len(text) - start,
                )
            )
            out.append(text[start:])
            position = len(text)
            break
        body = text[token.end() : close]
        written = text[start : close + 1]
        match = _REFERENCE.fullmatch(body)
        position = close + 1
        if match is None:
            errors.append(
                InterpolationError(
                    f"malformed reference {written!r}: write ${{VAR}} or ${{VAR:-default}} with VAR made of "
                    "letters, digits and '_'",
                    start,
                    len(written),
                )
            )
            out.append(written)
            continue
        name, default = match.group("name"), match.group("default")
        value = env.get(name)
        if default is not None and not value:
            out.append(default)
        elif value is not None:
            out.append(value)
        else:
            errors.append(
                InterpolationError(
                    f"environment variable {name} is not set (referenced as {written}; "
                    f"write ${{{name}:-default}} for a fallback)",
                    start,
                    len(written),
                )
            )
            out.append(written)
    out.append(text[position:])
    return "".join(out), errors
