"""The ``sim:`` section of a pipeline file: where the simulator comes from, and how its child is run.

:class:`SimSpec` says whether the sim is spawned (``factory``, or a ``lerobot_env`` config expanded
into the registry id and build arguments it stands for) or attached to (``url``, ``urls``, a
``fleet`` file), and the settings of each way (slots, shards, deadlines, interpreter, hold and
bounds). It is apart from the other sections (:mod:`hud_pipelines.spec.sections`) because its
rules (exactly one source, spawn-only settings, shards that fit, the lerobot expansion and its
dump as written) are the largest of any section and concern only the sim.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Self, cast

from pydantic import Field, SecretStr, SerializerFunctionWrapHandler, model_serializer, model_validator

from hud_pipelines.sim.actions import BoundsMode, HoldMode
from hud_pipelines.spec.base import Count, Float, StrictModel, schema_default
from hud_pipelines.spec.sections import spec_rule, spec_rules

SPAWN_ONLY_FIELDS = ("args", "contract", "startup_timeout_s", "hold", "bounds", "python", "max_frame_mb", "data_files")
"""Sim settings that configure a child the pipeline spawns; a sim attached by ``url`` was set up by its server."""
PROBED_TASKS = 3
"""How many resets of a pipeline's first episodes a spawned sim's start-up probe tries in turn (the first tasks',
then their next seeds'): enough that one task or seed whose ``reset`` raises does not stop every sim, few enough
that a sim whose every reset fails says so soon."""


def probe_resets(tasks: Sequence[tuple[int, Mapping[str, Any]]], episodes: int) -> list[tuple[int, Mapping[str, Any]]]:
    """The seeds and options of a spawned sim's start-up probe, tried in turn until a reset works, from the tasks'
    (seed, options) in order, each with ``episodes`` seeds (``seed``, ``seed + 1``, ...): the first episode's of
    each of the first tasks, then their next episodes', :data:`PROBED_TASKS` in all. An env's reset may need its
    task's options, and one task or one seed whose reset raises must error only its own episodes, not every sim."""
    ranked = [(seed + rank, options) for rank in range(episodes) for seed, options in tasks[:PROBED_TASKS]]
    return ranked[:PROBED_TASKS]


DEFAULT_MAX_FRAME_MB = 64.0
"""The largest WebSocket message of a spawned sim's link, in MiB, unless ``sim.max_frame_mb`` says (``serve``'s
``--max-frame-bytes`` default)."""
DEFAULT_BUSY_TIMEOUT_S = 600.0
"""How long an instance waits for served sims that other clients drive, unless ``sim.busy_timeout_s`` says."""
ATTACH_SOURCES = ("factory", "url", "urls", "fleet")
"""Where a sim comes from: spawned from a factory, or attached to one served sim, a list of them, or a fleet file."""


LEROBOT_ENV_SCHEMA: dict[str, Any] = {
    "required": ["type"],
    "properties": {"type": {"type": "string", "description": "the lerobot env type (`pusht`, `aloha`, ...)"}},
}


def _lerobot_env(fields: object, *, check_package: bool) -> Any:
    """``sim.lerobot_env`` resolved; a problem is a spec error at the config key it is about."""
    from hud_pipelines.spec.lerobot_env import LeRobotEnvError, resolve_lerobot_env

    if not isinstance(fields, dict):
        raise spec_rule("lerobot_env", f"expected a mapping with a 'type' (a lerobot env type), got {fields!r}")
    try:
        return resolve_lerobot_env(cast(dict[str, Any], fields), check_package=check_package)
    except LeRobotEnvError as exc:
        raise spec_rule(f"lerobot_env.{exc.key}".rstrip("."), str(exc)) from None


class SimSpec(StrictModel):
    """The simulator: spawned from a factory in a child process, or attached to by URL."""

    factory: str | None = Field(
        default=None,
        min_length=1,
        description="gymnasium registry id (`CartPole-v1`, `gym_pusht/PushT-v0`), `module:callable`, or "
        "`path/to/file.py:callable` relative to the YAML file; exactly one of `factory` and `url`",
    )
    args: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        json_schema_extra=schema_default({}),
        description="build arguments of the factory (its keyword parameters; `gym.make` keywords for a registry id)",
    )
    num_envs: Count = Field(
        default=1,
        description="slots per sim instance, stepped in lockstep (a vectorized factory batches them natively; a "
        "registry id is one env per slot, each with its own seed, unless `args` sets `vectorization_mode`); with "
        "`url`: set it to the served sim's `--num-envs` (a sim serving another count is refused)",
    )
    shards: Count = Field(
        default=1,
        # unsharded, it leaves the rollout hash as it was; sharded, it enters it: a vectorized factory then
        # builds batches of num_envs / shards, which only independent slots make the same episodes
        exclude_if=lambda value: value == 1,
        description="sim processes per instance, each serving a slice of the `num_envs` slots (as even as possible: "
        "the first `num_envs % shards` take one more), stepped in parallel and joined into one batch, so slot `i` "
        "runs the same episode as with one process; at most `num_envs`, only for a spawned sim (`factory`)",
    )
    contract: str | None = Field(
        default=None,
        min_length=1,
        description="contract.json relative to the YAML file: written from the derived contract on first use, "
        "edited by hand afterwards (names, descriptions, types, bounds: results of the contract before an edit are "
        "stale until they run again); an eval refuses a file whose shapes no "
        "longer match the env, and `hud-pipelines contract <pipeline>` refreshes it, keeping the edits that "
        "still fit; omitted: derived in memory each run; not with `url` (a served sim's contract is its server's "
        "`--contract`)",
    )
    data_files: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list[str],
        json_schema_extra=schema_default([]),
        description="files the sim reads besides its Python code (a MuJoCo XML and its meshes, a JSON scene, a module "
        "it imports by name at run time), relative to the YAML file: a file, a folder (every file below it, hidden "
        "files and `__pycache__` left out) or a glob pattern (`assets/**/*.xml`); their content joins the results' "
        "provenance as the code's does (its imports are followed on their own), so after an edit of one the earlier "
        "results show as not run until they run again; never in the rollout hash; only for a spawned sim (`factory`)",
    )
    startup_timeout_s: Float = Field(
        default=120.0, gt=0, description="deadline for the sim child to build its envs and listen"
    )
    step_timeout_s: Float = Field(
        default=60.0,
        gt=0,
        description="deadline of one reset or step request, and of the handshake (at least 6 s, at most 30 s)",
    )
    busy_timeout_s: Float = Field(
        default=DEFAULT_BUSY_TIMEOUT_S,
        gt=0,
        # at its default, it leaves the rollout hash as it was before it existed
        exclude_if=lambda value: value == DEFAULT_BUSY_TIMEOUT_S,
        description="with `url`, `urls` or `fleet`: how long an instance waits for a served sim while other clients "
        "drive every one it may use (they refuse it with HTTP 409: the Celery workers of one run, another run on the "
        "same fleet), trying again with backoff, before it errors as `sim_start`; a busy server is never lost, but one "
        "still running a request of a client that has gone, for longer than `step_timeout_s`, is hung: no instance "
        "waits for it",
    )
    python: str | None = Field(
        default=None,
        min_length=1,
        exclude_if=lambda value: value is None,  # unset, it leaves the rollout hash as it was before it existed
        description="the Python the sim child runs under, relative to the YAML file: an interpreter "
        "(`/opt/isaac/python.sh`), or a uv project directory whose `.venv/bin/python` is used (`../sims/metaworld`, "
        "set up by `uv sync --project sims/metaworld`); it needs numpy, gymnasium, pydantic, msgpack and websockets "
        "(the sim side of hud-pipelines, which is put on its `PYTHONPATH`), never torch; omitted: the agent's own",
    )
    hold: HoldMode = Field(
        default=HoldMode.LAST,
        description="action a finished slot receives while the others keep stepping: `last` or `zero` (a spawned "
        "sim's; a sim at `url` has its server's `--hold`)",
    )
    bounds: BoundsMode = Field(
        default=BoundsMode.CLIP,
        description="out-of-bounds continuous actions: `clip` into the bounds, or `error` (a spawned sim's; a sim at "
        "`url` has its server's `--bounds`)",
    )
    max_frame_mb: Float = Field(
        default=DEFAULT_MAX_FRAME_MB,
        ge=0.001,  # a limit that rounds to no bytes at all would refuse the handshake itself
        exclude_if=lambda value: value == DEFAULT_MAX_FRAME_MB,  # and never in the rollout hash (it is the link's)
        description="the largest message of a spawned sim's link, in MiB: one frame carries a whole batch (every "
        "slot's observation), so many slots of large cameras may need more; a larger frame ends the instance as "
        "`sim_link`, naming this key (a sim at `url` has its server's `--max-frame-bytes`)",
    )
    url: str | None = Field(
        default=None,
        pattern=r"^wss?://",
        description="`ws://host:port` of a sim served elsewhere (`hud-pipelines serve`); exactly one of "
        "`factory` and `url`",
    )
    urls: list[Annotated[str, Field(pattern=r"^wss?://")]] | None = Field(
        default=None,
        min_length=1,
        description="a fleet: `ws://host:port` of several sims served elsewhere, one instance on each at a time; a "
        "server that cannot be reached gets no more instances, and the one that tried it goes on to another",
    )
    fleet: str | None = Field(
        default=None,
        description="a fleet file (relative to the YAML) listing served sims (`servers:` of `ws://host:port` or "
        "`{url, token}` entries) and a default `token`, tokens written `${VAR}` to come from the environment; "
        "like `urls` otherwise",
    )
    token: SecretStr | None = Field(
        default=None,
        description="capability token of the sim at `url` (required with `url` or `urls`, one for the whole fleet; "
        "write `${VAR}` to keep it out of git; a `fleet` file holds its own tokens)",
    )
    lerobot_env: dict[str, Any] | None = Field(
        default=None,
        exclude_if=lambda value: value is None,  # unset, it leaves the rollout hash as it was before it existed
        json_schema_extra=LEROBOT_ENV_SCHEMA,
        description="a lerobot env config (`{type: pusht, episode_length: 300, ...}`, the fields of lerobot's "
        "`EnvConfig` of that type): the sim is the env lerobot's `make_env` builds for it (its gym id and "
        "`gym_kwargs`), and a lerobot policy gets its observations as `lerobot-eval` passes them "
        "(`preprocess_observation`, then the env's processors); instead of `factory` and `args`",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_lerobot_env(cls, data: Any) -> Any:
        """A ``lerobot_env`` becomes the registry id and build arguments it stands for (resolved in the parent)."""
        if not isinstance(data, dict):
            return data
        section = cast(dict[str, Any], data)
        if section.get("lerobot_env") is None:
            return section
        for key in (*ATTACH_SOURCES, "args"):
            if section.get(key) not in (None, {}):
                raise spec_rule(
                    key,
                    f"{key!r} and 'lerobot_env' exclude each other: the lerobot env config decides the env and its "
                    "build arguments (set them as fields of 'lerobot_env')",
                )
        env = _lerobot_env(section["lerobot_env"], check_package=section.get("python") is None)
        return {**section, "factory": env.gym_id, "args": env.build_args}

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A ``lerobot_env`` sim dumps as written: its registry id and build arguments are derived again on load."""
        dumped: Any = handler(self)
        if self.lerobot_env is None or not isinstance(dumped, dict):
            return dumped
        section = cast(dict[str, Any], dumped)
        section.pop("factory", None)
        section.pop("args", None)
        return section

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        sources = [name for name in ATTACH_SOURCES if getattr(self, name) is not None]
        if not sources:
            raise spec_rule(
                "factory",
                "the sim needs exactly one of 'factory' or 'lerobot_env' (spawn it) and 'url' (attach to it)",
            )
        if len(sources) > 1:
            raise spec_rule(
                sources[1],
                f"{sources[0]!r} and {sources[1]!r} exclude each other: spawn a sim or attach to one, not both",
            )
        if self.factory is None:  # every setting an attached sim cannot take, reported at once
            attach = sources[0]
            rules: list[tuple[str, str]] = []
            if attach == "fleet" and self.token is not None:
                rules.append(("token", "a sim fleet's tokens are in its file ('token', or per server)"))
            if self.token is not None and attach != "fleet" and not self.token.get_secret_value().strip():
                rules.append(("token", "the token is empty (an empty ${VAR}?): a served sim refuses every client then"))
            if self.token is None and attach != "fleet":
                rules.append(
                    (attach, f"a sim attached by {attach!r} needs its 'token' (e.g. token: ${{HUD_SIM_TOKEN}})")
                )
            rules += [
                (key, f"{key!r} configures a spawned sim; a sim attached by {attach!r} is set up by its server")
                for key in SPAWN_ONLY_FIELDS
                if key in self.model_fields_set
            ]
            if self.shards != 1:
                rules.append(
                    (
                        "shards",
                        f"shards={self.shards} splits a sim the pipeline spawns over several processes; a sim attached "
                        f"by {attach!r} serves its own slots (to use more cores, serve several sims and list them in "
                        "'urls': one instance runs on each)",
                    )
                )
            if rules:
                raise spec_rules(rules)
        elif self.token is not None:
            raise spec_rule("token", "'token' belongs to a sim attached by 'url'; a spawned sim gets a fresh one")
        elif self.busy_timeout_s != DEFAULT_BUSY_TIMEOUT_S:  # not by what is set: a run's resources set every field
            raise spec_rule(
                "busy_timeout_s", "'busy_timeout_s' waits for a sim served elsewhere; a spawned sim is this run's own"
            )
        return self

    @model_validator(mode="after")
    def _shards_fit(self) -> Self:
        if self.shards == 1:  # an attached sim's shards are refused with its other settings (_one_source)
            return self
        if self.shards > self.num_envs:
            raise spec_rule(
                "shards",
                f"shards={self.shards} needs at least one slot per shard, but num_envs is {self.num_envs}: "
                f"use at most {self.num_envs} shards, or more slots",
            )
        return self

    @property
    def servers(self) -> list[str]:
        """The URLs of the served sims listed in the YAML (none for a spawned sim or a fleet file)."""
        return list(self.urls) if self.urls is not None else [self.url] if self.url is not None else []

    @property
    def max_frame_bytes(self) -> int:
        """``max_frame_mb`` in bytes."""
        return int(self.max_frame_mb * 2**20)

    @property
    def spawned(self) -> bool:
        """The pipeline starts (and owns) the sim, rather than attaching to one served elsewhere."""
        return self.factory is not None

    def serve_options(self, probes: Sequence[tuple[int, Mapping[str, Any]]] = ()) -> list[str]:
        """Command-line options of ``hud-pipelines serve`` that carry this spec's sim-side settings; ``probes``: the
        seeds and options of the start-up resets, tried in turn, that sample an observation to derive the contract
        (a pipeline's first tasks', since an env's ``reset`` may need them)."""
        options = ["--hold", self.hold.value, "--bounds", self.bounds.value]
        if self.max_frame_mb != DEFAULT_MAX_FRAME_MB:
            options += ["--max-frame-bytes", str(self.max_frame_bytes)]
        for seed, reset_options in probes:
            options += ["--probe-seed", str(seed), "--probe-options", json.dumps(dict(reset_options), default=str)]
        return options
