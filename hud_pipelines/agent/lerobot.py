"""LeRobot policies behind the policy seam: loaded offline, batched, seeded per row.

Importing this module imports torch and lerobot (about 15 s the first time); nothing else in the
package imports it at module level.

The adapter from contract features to LeRobot inputs is :mod:`hud_pipelines.agent.lerobot_features`;
a sim built from a lerobot env config (``sim.lerobot_env``) gets lerobot's own observation processing
and the env's pre/post processors instead, so the policy is fed exactly as ``lerobot-eval`` feeds it.

Chunks come from ``predict_action_chunk`` (one forward per refill); the policy's ``n_action_steps``
becomes the agent's default horizon, which is what lerobot's own ``select_action`` queue executes.
ACT with ``temporal_ensemble_coeff`` asks for one action per step, each the weighted average of every
chunk predicted for that step, as lerobot's ``select_action`` computes it; the ensemble is kept per
episode (``PolicyBatch.episodes``) because the rows of a refill are only the slots that need actions.

Diffusion Policy samples at inference: the initial noise of ``conditional_sample`` and, with the DDPM
scheduler, fresh noise in every denoising step. Given ``PolicyBatch.streams`` each row takes all of it
from its own generator (:class:`DiffusionSampling`), seeded from the policy's seed and the row's
stream, so a row's noise is bit-identical alone, in any batch, in any order or split across calls. The
actions of a row are then the same up to float rounding: the network's matrix products are not
batch-invariant (MKL rounds a row differently at another batch size, ~1e-7 in a linear layer,
~5e-7 in normalised actions), which holds for ACT as much as for Diffusion. A batch without streams
keeps lerobot's behaviour: torch's global generator. Other lerobot policies that sample (pi0,
smolvla, vqbet, ...) still draw from torch's global generator.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any, TypedDict, Unpack

import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.act.modeling_act import ACTTemporalEnsembler
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from lerobot.policies.factory import make_policy_config as _make_policy_config  # pyright: ignore[reportUnknownVariableType]

from hud_pipelines.agent.checkpoint_files import policy_folder_problem
from hud_pipelines.agent.lerobot_features import LeRobotAdapter, LeRobotEnvAdapter, contract_stats
from hud_pipelines.agent.policy import Actions, PolicyBatch
from hud_pipelines.agent.torch_runtime import (
    LockstepForwards,
    resolve_device,
    row_generators,
)
from hud_pipelines.contract import Contract
from hud_pipelines.errors import PolicyError
from hud_pipelines.spec.agent import LeRobotPolicyConfig

log = logging.getLogger(__name__)
OFFLINE_DEFAULTS: dict[str, Any] = {"pretrained_backbone_weights": None}
"""Config fields that would download weights when a policy is built from scratch."""
ENSEMBLES_KEPT = 4096
"""Episodes whose temporal ensembles are kept at once (the least recently used go first)."""


class DiffusionSampling:
    """Every draw of a lerobot Diffusion Policy's inference taken row by row from the rows' generators.

    The initial noise ``[B, horizon, A]`` is built row by row and handed to ``predict_action_chunk``
    as ``noise``; the scheduler's own draws (DDPM's variance noise in each step; DDIM with ``eta = 0``
    draws none) get the list of generators, one per row, which diffusers' ``randn_tensor`` consumes
    row by row. lerobot calls ``noise_scheduler.step(..., generator=None)``, so the scheduler's
    ``step`` is wrapped once, on this policy's instance: inside :meth:`rows` it passes the rows'
    generators, outside it passes the call through unchanged. The generators are kept per thread, so
    forwards in two threads never trade noise.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        config = model.config
        self.shape: tuple[int, int, int] = (1, int(config.horizon), int(config.action_feature.shape[0]))
        """One row of the initial noise."""
        self._local = threading.local()
        self._wrap_step(model.noise_scheduler)

    @classmethod
    def of(cls, policy: Any) -> DiffusionSampling | None:
        """The sampling of ``policy`` when it is a lerobot Diffusion Policy, else ``None``."""
        model = getattr(policy, "diffusion", None)
        if getattr(policy.config, "type", None) != "diffusion" or model is None:
            return None
        return cls(model)

    def _wrap_step(self, scheduler: Any) -> None:
        original = scheduler.step
        local = self._local

        def step(*args: Any, **kwargs: Any) -> Any:
            generators = getattr(local, "generators", None)
            if generators is not None:
                kwargs["generator"] = generators
            return original(*args, **kwargs)

        scheduler.step = step

    @contextlib.contextmanager
    def rows(self, generators: list[torch.Generator]) -> Generator[torch.Tensor]:
        """The initial noise of one row per generator; every scheduler step inside draws from them too."""
        noise = torch.cat([torch.randn(self.shape, generator=g) for g in generators])
        parameter = next(iter(self.model.parameters()))
        self._local.generators = generators
        try:
            yield noise.to(parameter.device, parameter.dtype)
        finally:
            self._local.generators = None


class LoadOptions(TypedDict, total=False):
    """How :meth:`LeRobotPolicy.from_pretrained` and :meth:`LeRobotPolicy.random` build a policy."""

    device: torch.device | str
    """Where it runs (default ``cpu``)."""
    overrides: Mapping[str, Any] | None
    """Config fields to change (``n_action_steps``, ...); an unknown one is an error naming it."""
    rename: Mapping[str, str] | None
    """Contract feature -> lerobot input feature, where the names differ."""
    seed: int
    """Seeds random weights and the sampling (default 0)."""
    lerobot_env: Mapping[str, Any] | None
    """The lerobot env config the sim was built from: observations then go through lerobot's own processing."""


@dataclasses.dataclass(eq=False, repr=False)
class LeRobotPolicy(LockstepForwards):
    """A LeRobot ``PreTrainedPolicy`` with its pre/post processors and the contract adapter.

    ``seed`` is the policy's own part of every row's random stream (see :class:`DiffusionSampling`).
    """

    policy: Any
    preprocessor: Any
    postprocessor: Any
    adapter: LeRobotAdapter
    _: dataclasses.KW_ONLY
    seed: int = 0

    def __post_init__(self) -> None:
        self.sampling = DiffusionSampling.of(self.policy)
        """How each row's noise is drawn; ``None`` for a policy that does not sample (ACT)."""
        config = self.policy.config
        self.config: PreTrainedConfig = config
        steps = getattr(config, "n_action_steps", None)
        self.horizon: int | None = steps if isinstance(steps, int) and steps >= 1 else None
        history = getattr(config, "n_obs_steps", 1)
        self.observation_steps: int = history if isinstance(history, int) and history > 1 else 1
        coeff = getattr(config, "temporal_ensemble_coeff", None)
        self.ensemble_coeff: float | None = float(coeff) if isinstance(coeff, int | float) else None
        if self.ensemble_coeff is not None:
            self.horizon = 1  # one action per step, averaged over every chunk that covers it
        self._ensembles: collections.OrderedDict[str, ACTTemporalEnsembler] = collections.OrderedDict()

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def from_config(
        cls,
        config: LeRobotPolicyConfig,
        contract: Contract,
        *,
        base_dir: Path,
    ) -> LeRobotPolicy:
        device = resolve_device(config.device)
        seed = policy_seed(config)
        options: LoadOptions = {
            "device": device,
            "overrides": config.overrides,
            "rename": config.rename,
            "seed": seed,
            "lerobot_env": config.lerobot_env,
        }
        if config.path is not None:
            path = Path(config.path)
            policy = cls.from_pretrained(path if path.is_absolute() else base_dir / path, contract, **options)
        elif config.type is not None:
            policy = cls.random(config.type, contract, **options)
        else:
            raise PolicyError("a lerobot policy needs 'path' (a pretrained folder) or 'type' (random weights)")
        return policy

    @classmethod
    def from_pretrained(
        cls,
        path: Path,
        contract: Contract,
        **options: Unpack[LoadOptions],
    ) -> LeRobotPolicy:
        """Load a ``save_pretrained`` folder (config, weights, pre/post processors); never downloads.

        ``lerobot_env``: the lerobot env config the sim was built from; observations then go through
        lerobot's own processing (:class:`LeRobotEnvAdapter`), as in ``lerobot-eval``.
        """
        problem = policy_folder_problem(path)
        if problem is not None:
            raise PolicyError(problem)
        device = torch.device(options.get("device", "cpu"))
        config = _with_overrides(PreTrainedConfig.from_pretrained(path), options.get("overrides"), str(device))
        config.pretrained_path = path
        policy_cls = get_policy_class(config.type)
        policy: Any = policy_cls.from_pretrained(path, config=config)
        preprocessor, postprocessor = make_pre_post_processors(
            config,
            pretrained_path=str(path),
            preprocessor_overrides={"device_processor": {"device": str(device)}},
        )
        adapter = make_adapter(
            contract,
            device=device,
            expected_inputs=config.input_features,
            rename=options.get("rename"),
            lerobot_env=options.get("lerobot_env"),
            policy_config=config,
        )
        return cls(policy.to(device).eval(), preprocessor, postprocessor, adapter, seed=options.get("seed", 0))

    @classmethod
    def random(
        cls,
        policy_type: str,
        contract: Contract,
        **options: Unpack[LoadOptions],
    ) -> LeRobotPolicy:
        """A policy of ``policy_type`` with random weights, shaped by the contract (smoke runs, benchmarks).

        Normalisation statistics come from the contract's bounds where it has them (so random actions
        span the action range), identity elsewhere. ``seed`` draws the weights and seeds the sampling.
        """
        device = torch.device(options.get("device", "cpu"))
        seed = options.get("seed", 0)
        try:
            overrides = dict(options.get("overrides") or {})
            fields = {**_offline_defaults(policy_type), "device": str(device), **overrides}
            config: Any = make_policy_config(policy_type, **fields)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"cannot configure a lerobot {policy_type!r} policy: {exc}") from exc
        adapter = make_adapter(
            contract,
            device=device,
            rename=options.get("rename"),
            lerobot_env=options.get("lerobot_env"),
            policy_config=config,
        )
        config.input_features = adapter.input_features()
        config.output_features = adapter.output_features()
        torch.manual_seed(seed)
        policy: Any = get_policy_class(policy_type)(config=config)
        preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=contract_stats(adapter))
        return cls(policy.to(device).eval(), preprocessor, postprocessor, adapter, seed=seed)

    def save_pretrained(self, path: Path) -> Path:
        """Write the policy and its processors in lerobot's layout (loadable by ``lerobot-eval`` too)."""
        path.mkdir(parents=True, exist_ok=True)
        self.policy.save_pretrained(path)
        self.preprocessor.save_pretrained(path)
        self.postprocessor.save_pretrained(path)
        return path

    # -- the seam ----------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Clear lerobot's own queues (unused here: chunks are queued by the agent, per slot)."""
        self.policy.reset()
        self._ensembles.clear()

    def infer(self, batch: PolicyBatch) -> Actions:
        inputs = self.adapter.inputs(batch.observation, batch.prompts)
        with torch.inference_mode():
            processed = self.preprocessor(inputs)
            chunk = self._predict(processed, batch)
            if self.ensemble_coeff is not None:
                chunk = self._ensembled(chunk, batch.episodes)
            chunk = self.postprocessor(chunk)
        return self.adapter.actions(chunk)

    def _predict(self, processed: Any, batch: PolicyBatch) -> torch.Tensor:
        """``predict_action_chunk``; a sampling policy given streams draws each row's noise from its stream."""
        if self.sampling is None or batch.streams is None:
            return self.policy.predict_action_chunk(processed)
        with self.sampling.rows(row_generators(batch, self.seed)) as noise:
            return self.policy.predict_action_chunk(processed, noise=noise)

    def _ensembled(self, chunks: torch.Tensor, episodes: list[str] | None) -> torch.Tensor:
        """ACT's temporal ensembling, one lerobot ``ACTTemporalEnsembler`` per episode: ``[B, A]``.

        lerobot keeps one ensembler per batch, which assumes the same envs in the same rows on
        every call; here rows are the slots that need actions, so the state is kept per episode.
        """
        if episodes is None:
            raise PolicyError(
                "ACT's temporal ensembling keeps state per episode: every row of the batch must name its "
                "episode (PolicyBatch.episodes; RobotAgent sets it)"
            )
        assert self.ensemble_coeff is not None
        rows: list[torch.Tensor] = []
        for row, episode in enumerate(episodes):
            ensembler = self._ensembles.pop(episode, None)
            if ensembler is None:
                ensembler = ACTTemporalEnsembler(self.ensemble_coeff, int(chunks.shape[1]))
            self._ensembles[episode] = ensembler  # most recently used last
            rows.append(ensembler.update(chunks[row : row + 1]))
        while len(self._ensembles) > ENSEMBLES_KEPT:
            self._ensembles.popitem(last=False)
        return torch.cat(rows)


def make_adapter(
    contract: Contract,
    *,
    device: torch.device,
    rename: Mapping[str, str] | None,
    lerobot_env: Mapping[str, Any] | None,
    policy_config: Any,
    expected_inputs: Mapping[str, Any] | None = None,
) -> LeRobotAdapter:
    """The contract mapping, or lerobot's own processing with the env's processors for a ``lerobot_env`` sim."""
    if lerobot_env is None:
        return LeRobotAdapter(contract, device=device, expected_inputs=expected_inputs, rename=rename)
    from lerobot.envs.factory import make_env_pre_post_processors

    from hud_pipelines.spec.lerobot_env import lerobot_env_config

    return LeRobotEnvAdapter(
        contract,
        processors=make_env_pre_post_processors(lerobot_env_config(lerobot_env), policy_config),
        device=device,
        expected_inputs=expected_inputs,
        rename=rename,
    )


def policy_seed(config: LeRobotPolicyConfig) -> int:
    """The seed every row's random stream starts from (the config's ``seed``)."""
    return config.seed


def make_policy_config(policy_type: str, **fields: Any) -> Any:
    """lerobot's ``make_policy_config`` (typed here: lerobot leaves its keyword arguments untyped)."""
    return _make_policy_config(policy_type, **fields)


def _offline_defaults(policy_type: str) -> dict[str, Any]:
    try:
        config_cls: Any = PreTrainedConfig.get_choice_class(policy_type)
    except Exception as exc:
        known = ", ".join(sorted(PreTrainedConfig.get_known_choices()))
        raise PolicyError(f"unknown lerobot policy type {policy_type!r}; known types: {known}") from exc
    names = {f.name for f in dataclasses.fields(config_cls)}
    return {k: v for k, v in OFFLINE_DEFAULTS.items() if k in names}


def _with_overrides(config: Any, overrides: Mapping[str, Any] | None, device: str) -> Any:
    names = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides or {}) - names)
    if unknown:
        raise PolicyError(f"{config.type} policy config has no fields {unknown}")
    try:
        return dataclasses.replace(config, **dict(overrides or {}), device=device)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"invalid overrides {dict(overrides or {})} for a {config.type} policy: {exc}") from exc
