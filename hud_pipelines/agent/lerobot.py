"""LeRobot policies behind the policy seam, and the adapter from contract features to LeRobot inputs.

Importing this module imports torch and lerobot (about 15 s the first time); nothing else in the
package imports it at module level.

The adapter speaks lerobot's own vocabulary (``OBS_IMAGES``, ``OBS_STATE``, ``ACTION`` from
``lerobot.utils.constants``):

- every camera becomes ``observation.images.<name>``, ``[B, C, H, W]`` float32 in ``[0, 1]`` (BGR
  cameras are flipped to RGB); a policy that declares exactly one image input under another key
  (``observation.image`` in lerobot's PushT configs) gets the single camera there;
- the state features are concatenated in contract order into ``observation.state``;
- the prompts become ``task``;
- ``rename`` maps a contract feature to any other key (a renamed state feature is not concatenated).

Batched (``[B, ...]``) and unbatched observations go through the same code: an unbatched one gets
a batch axis of one on the way in and loses it on the way out. An observation history (a time
axis after the batch axis, for policies with ``n_obs_steps > 1``) is carried through unchanged.

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
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.act.modeling_act import ACTTemporalEnsembler
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from lerobot.policies.factory import make_policy_config as _make_policy_config  # pyright: ignore[reportUnknownVariableType]
from lerobot.utils.constants import ACTION, OBS_IMAGES, OBS_STATE

from hud_pipelines.agent.policy import Actions, PolicyBatch, as_chunks
from hud_pipelines.agent.torch_runtime import (
    AUTO,
    LockstepForwards,
    LockstepThreads,
    configure_threads,
    resolve_device,
    row_generators,
    to_tensor,
)
from hud_pipelines.contract import Contract, Feature
from hud_pipelines.contract import FeatureType as ContractFeatureType
from hud_pipelines.errors import PolicyError
from hud_pipelines.spec.agent import LeRobotPolicyConfig

log = logging.getLogger(__name__)
TASK = "task"
"""lerobot's batch key for the language instruction."""
OFFLINE_DEFAULTS: dict[str, Any] = {"pretrained_backbone_weights": None}
"""Config fields that would download weights when a policy is built from scratch."""
ENSEMBLES_KEPT = 4096
"""Episodes whose temporal ensembles are kept at once (the least recently used go first)."""


class LeRobotAdapter:
    """Maps contract observations to a LeRobot batch and LeRobot actions back to contract order."""

    def __init__(
        self,
        contract: Contract,
        *,
        device: torch.device | str = "cpu",
        expected_inputs: Mapping[str, Any] | None = None,
        rename: Mapping[str, str] | None = None,
    ) -> None:
        self.contract = contract
        self.device = torch.device(device)
        self.width = contract.action.size
        rename = dict(rename or {})
        unknown = sorted(set(rename) - set(contract.observation_features))
        if unknown:
            raise PolicyError(
                f"rename names {unknown}, which are not observation features of the contract "
                f"(it has {sorted(contract.observation_features)})"
            )
        expected = dict(expected_inputs or {})
        expected_images = [k for k, f in expected.items() if _is_visual(f)]
        self.cameras: dict[str, str] = {}
        for name in contract.cameras:
            key = rename.get(name, f"{OBS_IMAGES}.{name}")
            if expected_images and key not in expected and len(contract.cameras) == 1 and len(expected_images) == 1:
                key = expected_images[0]
            self.cameras[name] = key
        self.separate_states: dict[str, str] = {n: rename[n] for n in contract.state_features if n in rename}
        self.concatenated: list[str] = [n for n in contract.state_features if n not in rename]
        if expected:
            produced = set(self.input_keys)
            missing = sorted(k for k in expected if k not in produced)
            if missing:
                raise PolicyError(
                    f"the policy expects inputs {missing} that the contract does not provide; the contract gives "
                    f"{sorted(produced)} (cameras {list(contract.cameras)}, state {list(contract.state_features)}). "
                    "Map features with 'rename'."
                )

    @property
    def input_keys(self) -> list[str]:
        keys = [*self.cameras.values(), *self.separate_states.values()]
        return [*keys, OBS_STATE] if self.concatenated else keys

    def input_features(self) -> dict[str, PolicyFeature]:
        """lerobot ``PolicyFeature``s of the inputs this adapter produces (for building a policy from scratch)."""
        features: dict[str, PolicyFeature] = {}
        for name, key in self.cameras.items():
            height, width, channels = self.contract.features[name].shape
            features[key] = PolicyFeature(type=FeatureType.VISUAL, shape=(channels, height, width))
        for name, key in self.separate_states.items():
            features[key] = PolicyFeature(type=FeatureType.STATE, shape=(self.contract.features[name].size,))
        if self.concatenated:
            size = sum(self.contract.features[n].size for n in self.concatenated)
            features[OBS_STATE] = PolicyFeature(type=FeatureType.STATE, shape=(size,))
        return features

    def output_features(self) -> dict[str, PolicyFeature]:
        return {ACTION: PolicyFeature(type=FeatureType.ACTION, shape=(self.width,))}

    # -- conversion ----------------------------------------------------------------------------------

    def batched(self, observation: Mapping[str, npt.NDArray[Any]]) -> bool:
        """Whether ``observation`` carries a batch axis (decided on one feature, checked on all)."""
        verdicts = {
            name: np.ndim(value) > len(self.contract.features[name].shape) for name, value in observation.items()
        }
        if len(set(verdicts.values())) > 1:
            raise PolicyError(f"some observation features are batched and some are not: {verdicts}")
        return next(iter(verdicts.values()), True)

    def inputs(
        self, observation: Mapping[str, npt.NDArray[Any]], prompts: Sequence[str] | str
    ) -> dict[str, torch.Tensor | list[str]]:
        """The LeRobot batch for ``observation`` (``[B, ...]`` arrays, or one unbatched observation)."""
        missing = sorted(set(self.contract.observation_features) - set(observation))
        if missing:
            raise PolicyError(f"the observation lacks contract features {missing}")
        if not self.batched(observation):
            observation = {k: np.asarray(v)[None] for k, v in observation.items()}
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        elif isinstance(prompts, str):
            rows = next((int(np.shape(v)[0]) for v in observation.values()), 0)
            prompts = [prompts] * rows
        out: dict[str, torch.Tensor | list[str]] = {}
        for name, key in self.cameras.items():
            out[key] = self._image(self.contract.features[name], observation[name])
        for name, key in self.separate_states.items():
            out[key] = self._state([(self.contract.features[name], observation[name])])
        if self.concatenated:
            out[OBS_STATE] = self._state([(self.contract.features[n], observation[n]) for n in self.concatenated])
        out[TASK] = list(prompts)
        return out

    def _image(self, feature: Feature, array: npt.NDArray[Any]) -> torch.Tensor:
        """``[..., H, W, C]`` -> ``[..., C, H, W]`` float32; uint8 scaled to ``[0, 1]``."""
        tensor = to_tensor(array, self.device)
        if feature.type is ContractFeatureType.BGR:
            tensor = tensor.flip(-1)
        tensor = tensor.movedim(-1, -3)
        if tensor.dtype == torch.uint8:
            return tensor.to(torch.float32).div_(255.0).contiguous()
        return tensor.to(torch.float32).contiguous()

    def _state(self, parts: list[tuple[Feature, npt.NDArray[Any]]]) -> torch.Tensor:
        flat = [np.asarray(a).reshape(*np.shape(a)[: np.ndim(a) - len(f.shape)], f.size) for f, a in parts]
        joined = flat[0] if len(flat) == 1 else np.concatenate(flat, axis=-1)
        return to_tensor(joined, self.device, dtype=torch.float32)

    def actions(self, output: torch.Tensor, *, batched: bool = True) -> Actions:
        """LeRobot actions (``[B, T, A]`` or ``[B, A]``) as float32 numpy chunks in contract order."""
        array = cast(npt.NDArray[Any], output.detach().to("cpu", torch.float32).numpy())
        if not batched:
            array = array[None]
        return as_chunks(array, array.shape[0], self.width, source="the LeRobot policy")


def _is_visual(feature: object) -> bool:
    return getattr(feature, "type", None) is FeatureType.VISUAL


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


class LeRobotPolicy(LockstepForwards):
    """A LeRobot ``PreTrainedPolicy`` with its pre/post processors and the contract adapter.

    ``seed`` is the policy's own part of every row's random stream (see :class:`DiffusionSampling`).
    """

    def __init__(
        self, policy: Any, preprocessor: Any, postprocessor: Any, adapter: LeRobotAdapter, *, seed: int = 0
    ) -> None:
        self.policy = policy
        self.preprocessor = preprocessor
        self.postprocessor = postprocessor
        self.adapter = adapter
        self.seed = seed
        self.sampling = DiffusionSampling.of(policy)
        """How each row's noise is drawn; ``None`` for a policy that does not sample (ACT)."""
        config = policy.config
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
        torch_threads: int | None = 1,
        lockstep_threads: LockstepThreads = AUTO,
    ) -> LeRobotPolicy:
        configure_threads(torch_threads)
        device = resolve_device(config.device)
        seed = policy_seed(config)
        if config.path is not None:
            path = Path(config.path)
            path = path if path.is_absolute() else base_dir / path
            policy = cls.from_pretrained(
                path, contract, device=device, overrides=config.overrides, rename=config.rename, seed=seed
            )
        elif config.type is not None:
            policy = cls.random(
                config.type, contract, device=device, overrides=config.overrides, rename=config.rename, seed=seed
            )
        else:
            raise PolicyError("a lerobot policy needs 'path' (a pretrained folder) or 'type' (random weights)")
        policy.lockstep_threads = lockstep_threads
        return policy

    @classmethod
    def from_pretrained(
        cls,
        path: Path,
        contract: Contract,
        *,
        device: torch.device | str = "cpu",
        overrides: Mapping[str, Any] | None = None,
        rename: Mapping[str, str] | None = None,
        seed: int = 0,
    ) -> LeRobotPolicy:
        """Load a ``save_pretrained`` folder (config, weights, pre/post processors); never downloads."""
        if not (path / "config.json").is_file():
            raise PolicyError(f"{path} is not a pretrained LeRobot policy folder (no config.json)")
        device = torch.device(device)
        config = _with_overrides(PreTrainedConfig.from_pretrained(path), overrides, str(device))
        config.pretrained_path = path
        policy_cls = get_policy_class(config.type)
        policy: Any = policy_cls.from_pretrained(path, config=config)
        preprocessor, postprocessor = make_pre_post_processors(
            config,
            pretrained_path=str(path),
            preprocessor_overrides={"device_processor": {"device": str(device)}},
        )
        adapter = LeRobotAdapter(contract, device=device, expected_inputs=config.input_features, rename=rename)
        return cls(policy.to(device).eval(), preprocessor, postprocessor, adapter, seed=seed)

    @classmethod
    def random(
        cls,
        policy_type: str,
        contract: Contract,
        *,
        device: torch.device | str = "cpu",
        overrides: Mapping[str, Any] | None = None,
        rename: Mapping[str, str] | None = None,
        seed: int = 0,
    ) -> LeRobotPolicy:
        """A policy of ``policy_type`` with random weights, shaped by the contract (smoke runs, benchmarks).

        Normalisation statistics come from the contract's bounds where it has them (so random actions
        span the action range), identity elsewhere. ``seed`` draws the weights and seeds the sampling.
        """
        device = torch.device(device)
        adapter = LeRobotAdapter(contract, device=device, rename=rename)
        try:
            fields = {**_offline_defaults(policy_type), "device": str(device), **dict(overrides or {})}
            config: Any = make_policy_config(policy_type, **fields)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"cannot configure a lerobot {policy_type!r} policy: {exc}") from exc
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


def contract_stats(adapter: LeRobotAdapter) -> dict[str, dict[str, torch.Tensor]]:
    """Normalisation statistics implied by the contract's bounds (state and action features that have them)."""
    contract = adapter.contract
    stats: dict[str, dict[str, torch.Tensor]] = {}
    bounded = [contract.features[n] for n in adapter.concatenated]
    if bounded and all(f.low is not None and f.high is not None for f in bounded):
        stats[OBS_STATE] = _bounds_stats(
            [v for f in bounded for v in f.low or []], [v for f in bounded for v in f.high or []]
        )
    for name, key in adapter.separate_states.items():
        feature = contract.features[name]
        if feature.low is not None and feature.high is not None:
            stats[key] = _bounds_stats(feature.low, feature.high)
    action = contract.action
    if action.low is not None and action.high is not None:
        stats[ACTION] = _bounds_stats(action.low, action.high)
    return stats


def _bounds_stats(low: list[float], high: list[float]) -> dict[str, torch.Tensor]:
    lo = torch.tensor(low, dtype=torch.float32)
    hi = torch.tensor(high, dtype=torch.float32)
    return {"min": lo, "max": hi, "mean": (lo + hi) / 2, "std": ((hi - lo) / 2).clamp_min(1e-6)}
