"""Typed agent settings, as written under ``agent:`` in a pipeline YAML.

Policies are chosen by their ``kind``; each kind has its own strict model so a typo in a key fails
at load time and the JSON Schema documents every option. As everywhere in a pipeline file
(:mod:`hud_pipelines.spec.base`), numbers refuse booleans and credentials are secrets. These models
hold settings only; building a policy from them (and importing torch or lerobot) happens in
:mod:`hud_pipelines.agent.policy`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PrivateAttr, SecretStr, model_validator

from hud_pipelines.spec.base import Count, Float, Int, StrictModel, target_field
from hud_pipelines.spec.problems import did_you_mean
from hud_pipelines.spec.sections import spec_rule

DEFAULT_SEND_AHEAD = 8
"""Steps in flight beyond the one being read: enough to hide a few milliseconds of network round trip
behind a fast sim (see ``bench/remote.md``); a local sim needs one."""


DEFAULT_FORWARD_TIMEOUT_S = 300.0
"""Long enough for a first forward that compiles kernels or loads weights lazily on a loaded CPU; a
forward that never returns still cannot hang a run."""


LABEL_SEPARATORS = {"|": "Dagster joins a partition key's dimensions with it", ",": "a run's tag joins labels with it"}


def label_problem(label: str) -> str | None:
    """Why ``label`` cannot name a checkpoint of a sweep, or ``None``.

    A label is the folder of the checkpoint's results below the sweep's ``checkpoints/`` (``/`` nests one, as a
    sweep of several runs does: ``run/step``) and a key of Dagster's checkpoint partitions; a label that is not
    such a folder would file its results where the sweep's table never looks, or outside the outputs."""
    said = repr(label)
    if not label.strip() or label != label.strip():
        return f"checkpoint label {said} is empty or begins or ends with white space"
    if separators := sorted(c for c in LABEL_SEPARATORS if c in label):
        return f"checkpoint label {said} holds {separators[0]!r}: {LABEL_SEPARATORS[separators[0]]}"
    if "..." in label or any(not c.isprintable() for c in label):
        return f"checkpoint label {said} holds '...' or a character that is not printable (Dagster refuses those)"
    if any(not part or part.startswith(".") for part in label.split("/")):
        return (
            f"checkpoint label {said} is no folder below the sweep's checkpoints/: a '/' at either end, '//', or a "
            "part that starts with '.' ('.', '..', a hidden folder)"
        )
    return None


def nested_label(labels: Collection[str]) -> tuple[str, str] | None:
    """A label that is a folder above another (``act`` and ``act/000100``), with that other; ``None`` when none is:
    each label's results need a folder of their own (:func:`label_problem`)."""
    for label in labels:
        parts = label.split("/")
        above = next((a for depth in range(1, len(parts)) if (a := "/".join(parts[:depth])) in labels), None)
        if above is not None:
            return above, label
    return None


def _usable_label(label: str) -> str:
    problem = label_problem(label)
    if problem is not None:
        raise ValueError(problem)
    return label


DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hpu", "npu", "mtia", "xla", "meta", "privateuseone")
"""The torch device types a policy's ``device`` may name (with ``:<index>``), besides ``auto``."""


def _torch_device(device: str) -> str:
    """``device`` when it names a torch device (a typo would fail every instance of the run, found only there)."""
    kind, colon, index = device.partition(":")
    if device == "auto" or (kind in DEVICE_TYPES and (not colon or index.isdigit())):
        return device
    raise ValueError(
        f"unknown torch device {device!r}: 'auto', or one of {', '.join(DEVICE_TYPES)} with an optional "
        f"':<index>' ('cuda:1'){did_you_mean(kind, DEVICE_TYPES)}"
    )


Device = Annotated[str, AfterValidator(_torch_device)]


class CheckpointEntry(StrictModel):
    """One checkpoint of a sweep named by hand: its label in tables and plots, and its folder or file."""

    label: Annotated[str, AfterValidator(_usable_label)] = Field(
        min_length=1,
        description="the checkpoint's name in the comparison (unique in the sweep) and the folder of its results "
        "('/' nests one, and no label is a folder above another; no '|', ',', '...', characters that are not "
        "printable, white space at either end, nor a part that is empty or starts with '.')",
    )
    path: str = Field(description="the checkpoint's folder (lerobot) or module file (torch), relative to the YAML")
    step: Int | None = Field(default=None, ge=0, description="its training step, for the success-vs-step plot")


CheckpointSources = str | list[str | CheckpointEntry]
"""Where a sweep finds its checkpoints: a training run's directory, several of them, or entries by hand."""

CHECKPOINTS_DESCRIPTION = (
    "evaluate every checkpoint of a training run on the same episodes (a sweep): the run's directory as "
    "lerobot-train writes it (<dir>/checkpoints/<step>/pretrained_model/), a folder of save_pretrained folders, "
    "several run directories, or a list of {label, path, step (optional)}; checkpoints are picked up as they "
    "appear, once complete"
)


class RandomPolicyConfig(StrictModel):
    """Uniform random actions from the contract's action bounds (seeded)."""

    kind: Literal["random"] = "random"
    seed: Int = Field(default=0, description="seed of the policy's random generator")
    chunk_size: Count = Field(default=1, description="actions per inference call")


class ConstantPolicyConfig(StrictModel):
    """The same action every step (zeros by default); useful as a hold or smoke-test policy."""

    kind: Literal["constant"] = "constant"
    value: list[Float] | None = Field(
        default=None, description="the action, flat in contract order; zeros when omitted"
    )


class ScriptedPolicyConfig(StrictModel):
    """Any Python callable by import path, e.g. a PD controller in ``envs/``; what it receives and returns is below."""

    kind: Literal["scripted"] = "scripted"
    target: str = target_field(
        "callable",
        "called as target(**args) when it is a class or factory returning a policy, or used directly "
        "as fn(observation_batch) -> actions",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for target when it is a factory")


class TorchPolicyConfig(StrictModel):
    """A ``torch.nn.Module`` class by import path, with an optional checkpoint."""

    kind: Literal["torch"] = "torch"
    target: str = target_field(
        "Class",
        "of a torch.nn.Module whose forward takes the observation batch as a dict of tensors "
        "({feature: [B, ...]}) and returns [B, T, A] or [B, A]",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the module's constructor")
    checkpoint: str | None = Field(
        default=None, description="a state_dict file (torch.save) to load, relative to the YAML"
    )
    checkpoints: CheckpointSources | None = Field(
        default=None,
        description="a sweep over state_dict files instead of one checkpoint: a directory of *.pt / *.pth files "
        "(one checkpoint each, named by file), several directories, or a list of {label, path}",
    )
    device: Device = Field(default="auto", description="'auto' (CUDA when present), 'cpu', 'cuda', 'cuda:1', ...")

    @model_validator(mode="after")
    def _one_checkpoint_source(self) -> TorchPolicyConfig:
        if self.checkpoint is not None and self.checkpoints is not None:
            raise spec_rule("checkpoints", "give 'checkpoint' (one state_dict) or 'checkpoints' (a sweep), not both")
        return self


class LeRobotPolicyConfig(StrictModel):
    """Any LeRobot policy type through lerobot's own factory; never downloads anything."""

    kind: Literal["lerobot"] = "lerobot"
    seed: Int = Field(
        default=0,
        description="seed of the policy's random streams (Diffusion Policy's noise: one stream per episode) and "
        "of the random weights built for 'type'",
    )
    path: str | None = Field(
        default=None, description="a local pretrained folder (save_pretrained layout with its pre/post processors)"
    )
    type: str | None = Field(
        default=None,
        description="a policy type (act, diffusion, ...) built with random weights for smoke runs when no path",
    )
    checkpoints: CheckpointSources | None = Field(default=None, description=CHECKPOINTS_DESCRIPTION)
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="config fields to override (e.g. n_action_steps)"
    )
    device: Device = Field(default="auto", description="'auto' (CUDA when present), 'cpu', 'cuda', ...")
    rename: dict[str, str] = Field(
        default_factory=dict,
        description="contract feature -> LeRobot input key, for inputs not named observation.images.<camera> / "
        "observation.state (a renamed state feature is passed on its own, not concatenated)",
    )
    _lerobot_env: dict[str, Any] | None = PrivateAttr(default=None)

    @property
    def lerobot_env(self) -> dict[str, Any] | None:
        """The lerobot env config (``sim.lerobot_env``) whose observation processing the policy's inputs follow."""
        return self._lerobot_env

    def for_lerobot_env(self, env: dict[str, Any]) -> LeRobotPolicyConfig:
        """This policy fed as ``lerobot-eval`` feeds it on the lerobot env config ``env`` (set by the pipeline)."""
        config = self.model_copy()
        config._lerobot_env = dict(env)
        return config

    @model_validator(mode="after")
    def _one_weights_source(self) -> LeRobotPolicyConfig:
        if self.checkpoints is not None and (self.path is not None or self.type is not None):
            raise spec_rule("checkpoints", "give 'checkpoints' (a sweep) or 'path' / 'type' (one policy), not both")
        if self.checkpoints is None and self.path is None and self.type is None:  # nothing to load: said at the YAML
            raise spec_rule("path", "give 'path' (a pretrained folder), 'type' (random weights) or 'checkpoints'")
        return self


class RemotePolicyConfig(StrictModel):
    """A policy served elsewhere over an openpi-style websocket (metadata frame, msgpack infer)."""

    kind: Literal["remote"] = "remote"
    url: str = Field(pattern=r"^wss?://", description="ws://host:port (or wss://) of the policy server")
    api_key: SecretStr | None = Field(
        default=None,
        description="sent as the Authorization header when set (write `${VAR}` to keep it out of git); a "
        "credential, not an input: never printed, and changing it keeps earlier results",
    )
    timeout_s: Float = Field(
        default=60.0,
        gt=0,
        description="deadline of one inference call: the episodes waiting on it end as errored (policy timeout), "
        "the instance fails, and the next call opens a new connection",
    )
    batched: bool = Field(
        default=False,
        description="send one request per batch with a leading batch axis; by default one request per slot "
        "(openpi servers take unbatched observations)",
    )
    rename: dict[str, str] = Field(
        default_factory=dict, description="contract feature -> key in the request (e.g. 'observation/state')"
    )
    prompt_key: str = Field(default="prompt", description="request key of the task prompt")


PolicyConfig = Annotated[
    RandomPolicyConfig
    | ConstantPolicyConfig
    | ScriptedPolicyConfig
    | TorchPolicyConfig
    | LeRobotPolicyConfig
    | RemotePolicyConfig,
    Field(discriminator="kind"),
]


class BatchingConfig(StrictModel):
    """How calls from concurrent sims are stacked into one policy forward (``BatchedModel``)."""

    max_wait_ms: Float = Field(
        default=5.0,
        ge=0,
        description="longest wait for more callers before a forward; never waited when all are present",
    )
    batch_size: Count | None = Field(default=None, description="flush as soon as this many rows are queued")
    across_instances: bool = Field(
        default=False,
        description="stack the rows of concurrent instances into one forward (faster with max_concurrent > 1); "
        "off by default because a torch forward rounds a row differently in another batch, so actions would "
        "differ in the last bits between runs; random and scripted row-wise policies are exact either way",
    )


class AgentConfig(StrictModel):
    """The agent that drives every slot of a sim."""

    policy: PolicyConfig
    horizon: Count | None = Field(
        default=None,
        description="execute the first k actions of each chunk before asking again (default: whole chunk)",
    )
    send_ahead: Int = Field(
        default=DEFAULT_SEND_AHEAD,
        ge=0,
        le=64,
        description="steps sent to a served sim before the observation they follow arrives, when their actions "
        "are already queued (open-loop chunks): the sim steps while replies cross the wire; same episodes, so "
        "changing it keeps every result current; 0 waits for every reply",
    )
    forward_timeout_s: Float = Field(
        default=DEFAULT_FORWARD_TIMEOUT_S,
        gt=0,
        description="deadline of one policy forward: the slots waiting on a later one end as errored (policy "
        "timeout) and the instance fails; rollout_timeout_s still bounds the whole instance",
    )
    batching: BatchingConfig = Field(
        default=BatchingConfig(), description="how calls from concurrent sims share one forward"
    )
    torch_threads: Count | None = Field(
        default=1,
        description="torch intra-op threads (1 keeps latency stable while sims share the cores; null = torch default)",
    )
    lockstep_threads: Count | Literal["auto"] | None = Field(
        default="auto",
        description="torch intra-op threads for a forward that every sim of the eval waits on (a lockstep "
        "refill: the sims' cores are idle then); auto = one per waiting sim plus one, at most the CPUs this "
        "process may use; null = torch_threads for every forward",
    )
