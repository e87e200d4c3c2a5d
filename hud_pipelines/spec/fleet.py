"""A fleet file: the served sims a pipeline attaches to, each with its own token (``sim.fleet``).

::

    # fleets/lab.yaml
    token: ${LAB_SIM_TOKEN}              # every server's token, unless it names its own
    servers:
      - ws://sim-a:8765
      - url: ws://sim-b:8765
        token: ${SIM_B_TOKEN}

Machines of a lab rarely share one secret, and the list of them is shared by many pipelines, so it
lives in a file of its own that pipelines name. Tokens come from the environment (``${VAR}``, as in a
pipeline), so the file can be committed. It is read where the run starts (and by ``validate``); a
missing file, an unset variable, or a server left without a token is an error at its line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from hud_pipelines.spec.document import read_document
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem, SpecError, display_path
from hud_pipelines.spec.validation import validation_problems

ServerUrl = Annotated[str, Field(pattern=r"^wss?://")]


class FleetServer(BaseModel):
    """One served sim of the fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: ServerUrl = Field(description="`ws://host:port` of a sim served by `hud-pipelines serve`")
    token: SecretStr | None = Field(default=None, description="its capability token; default: the fleet's")


class Fleet(BaseModel):
    """The servers of a fleet file and the token each one is reached with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: SecretStr | None = Field(default=None, description="the token of every server that names none")
    servers: list[ServerUrl | FleetServer] = Field(
        min_length=1, description="`ws://host:port`, or `{url, token}` for a server with a token of its own"
    )

    @model_validator(mode="after")
    def _every_server_has_a_token(self) -> Self:
        if self.token is None:
            for server in self.servers:
                if isinstance(server, str) or server.token is None:
                    url = server if isinstance(server, str) else server.url
                    raise ValueError(f"{url} has no token: give it one ({{url, token}}) or set the fleet's 'token'")
        urls = [url for url, _ in self.resolved()]
        repeated = sorted({url for url in urls if urls.count(url) > 1})
        if repeated:
            raise ValueError(f"{repeated[0]} is listed twice; each served sim takes one instance at a time")
        return self

    def resolved(self) -> list[tuple[str, str]]:
        """``(url, token)`` of every server, in the file's order."""
        default = "" if self.token is None else self.token.get_secret_value()
        pairs: list[tuple[str, str]] = []
        for server in self.servers:
            if isinstance(server, str):
                pairs.append((server, default))
            else:
                own = server.token.get_secret_value() if server.token is not None else default
                pairs.append((server.url, own))
        return pairs


def load_fleet(path: Path, env: Mapping[str, str] | None = None) -> Fleet:
    """The fleet file at ``path``; :class:`SpecError` listing every problem with its line otherwise."""
    problems = fleet_problems(path, env)
    if problems:
        raise SpecError(problems)
    fleet, _ = _read(path, env)
    assert fleet is not None
    return fleet


def fleet_problems(path: Path, env: Mapping[str, str] | None = None) -> list[Problem]:
    """What is wrong with the fleet file at ``path`` (empty: it loads)."""
    return _read(path, env)[1]


def _read(path: Path, env: Mapping[str, str] | None) -> tuple[Fleet | None, list[Problem]]:
    file = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return None, [Problem(file, 0, 0, "", f"cannot read the fleet file: {exc.strerror or exc}")]
    if not text.strip():
        return None, [Problem(file, 1, 1, "", "the fleet file is empty; it needs 'servers' (and a 'token')")]
    document, problems = read_document(text, file, os.environ if env is None else env)
    if document is None:
        return None, problems
    try:
        fleet = Fleet.model_validate(document.data)
    except ValidationError as exc:
        return None, problems + validation_problems(exc, document, Fleet)
    return (fleet if not problems else None), problems


def attached_servers(spec: PipelineSpec, env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(url, token)`` of every served sim ``spec`` attaches to: its ``url``, ``urls`` or fleet file's."""
    if spec.sim.fleet is not None:
        return load_fleet(spec.resolve_path(spec.sim.fleet), env).resolved()
    token = "" if spec.sim.token is None else spec.sim.token.get_secret_value()
    return [(url, token) for url in spec.sim.servers]
