"""From contract features to LeRobot inputs and back: what a lerobot policy sees of a sim.

Importing this module imports torch and lerobot.

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

A sim built from a lerobot env config (``sim.lerobot_env``) is read by :class:`LeRobotEnvAdapter`
instead: the contract's features become the env's observation tree again (nested keys split at
``/``) and go through lerobot's own ``preprocess_observation`` and the env's pre-processor, as in
``lerobot-eval``, so the keys and values are lerobot's by construction (PushT with
``environment_state_agent_pos`` gives ``observation.environment_state`` beside ``observation.state``,
where the contract mapping above would concatenate them); actions go through the env's
post-processor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.envs.utils import preprocess_observation as _preprocess_observation  # pyright: ignore[reportUnknownVariableType]
from lerobot.utils.constants import ACTION, OBS_ENV_STATE, OBS_IMAGES, OBS_PREFIX, OBS_STATE

from hud_pipelines.agent.policy import Actions, as_chunks
from hud_pipelines.agent.torch_runtime import (
    to_tensor,
)
from hud_pipelines.contract import Contract, Feature
from hud_pipelines.contract import FeatureType as ContractFeatureType
from hud_pipelines.errors import PolicyError

TASK = "task"
"""lerobot's batch key for the language instruction."""


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
        for name in contract.state_features:  # a dataset kept it apart (an integer float32 would round), as it reads
            key = f"{OBS_PREFIX}{name.replace('/', '_')}"
            if name not in rename and key in expected and key != OBS_STATE:
                self.separate_states[name] = key
        self.concatenated: list[str] = [n for n in contract.state_features if n not in self.separate_states]
        if expected:
            produced = set(self.input_keys)
            missing = sorted(k for k in expected if k not in produced)
            if missing:
                raise PolicyError(
                    f"the policy expects inputs {missing} that the contract does not provide; the contract gives "
                    f"{sorted(produced)} (cameras {list(contract.cameras)}, state {list(contract.state_features)}). "
                    "Map features with 'rename'."
                )
            self._check_shapes(expected)

    def _check_shapes(self, expected: Mapping[str, Any]) -> None:
        """Refuse inputs whose shape differs from the checkpoint's, naming both sides.

        A state of the wrong size would fail deep inside the first forward (or, worse, broadcast);
        an image may differ in height and width (lerobot's vision backbones take any size) but not
        in channels.
        """
        wrong: list[str] = []
        for key, produced in self.input_features().items():
            wanted = tuple(getattr(expected.get(key), "shape", None) or ())
            if not wanted or wanted == produced.shape:
                continue
            if produced.type is FeatureType.VISUAL and wanted[0] == produced.shape[0]:
                continue
            wrong.append(f"{key}: the policy expects shape {list(wanted)}, the contract gives {list(produced.shape)}")
        if wrong:
            sources = f"cameras {list(self.contract.cameras)}, state {list(self.contract.state_features)}"
            raise PolicyError(
                f"the policy's inputs do not match the sim: {'; '.join(wrong)} ({sources}; "
                f"{OBS_STATE} concatenates {self.concatenated}). Map features with 'rename'."
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
            kind = FeatureType.ENV if key == OBS_ENV_STATE else FeatureType.STATE
            features[key] = PolicyFeature(type=kind, shape=(self.contract.features[name].size,))
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
        observation, prompts = self._as_batch(observation, prompts)
        out: dict[str, torch.Tensor | list[str]] = {}
        for name, key in self.cameras.items():
            out[key] = self._image(self.contract.features[name], observation[name])
        for name, key in self.separate_states.items():
            out[key] = self._state([(self.contract.features[name], observation[name])])
        if self.concatenated:
            out[OBS_STATE] = self._state([(self.contract.features[n], observation[n]) for n in self.concatenated])
        out[TASK] = list(prompts)
        return out

    def _as_batch(
        self, observation: Mapping[str, npt.NDArray[Any]], prompts: Sequence[str] | str
    ) -> tuple[Mapping[str, npt.NDArray[Any]], list[str]]:
        """``observation`` as ``[B, ...]`` arrays with one prompt per row; every contract feature present."""
        missing = sorted(set(self.contract.observation_features) - set(observation))
        if missing:
            raise PolicyError(f"the observation lacks contract features {missing}")
        if not self.batched(observation):
            observation = {k: np.asarray(v)[None] for k, v in observation.items()}
        rows = next((int(np.shape(v)[0]) for v in observation.values()), 0)
        return observation, [prompts] * rows if isinstance(prompts, str) else list(prompts)

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


class LeRobotEnvAdapter(LeRobotAdapter):
    """The adapter of a sim built from a lerobot env config: lerobot's own observation processing.

    ``preprocess_observation`` decides each feature's key (found once, by passing it each feature
    alone), so the policy's expected inputs are checked and a policy built from scratch is shaped as
    lerobot-eval would feed it; every batch then goes through that function whole and the env's
    pre-processor (``make_env_pre_post_processors``: identity for PushT), and its keys are renamed
    where ``rename`` (lerobot-eval's ``rename_map``) or a policy's single camera key says so. An
    observation history is processed one time step at a time.
    """

    def __init__(
        self,
        contract: Contract,
        *,
        processors: tuple[Any, Any],
        device: torch.device | str = "cpu",
        expected_inputs: Mapping[str, Any] | None = None,
        rename: Mapping[str, str] | None = None,
    ) -> None:
        # the env's pre- and post-processor, as lerobot's make_env_pre_post_processors gives them
        self.env_preprocessor, self.env_postprocessor = processors
        self.lerobot_keys = lerobot_keys(contract)
        """Contract feature -> the key lerobot's ``preprocess_observation`` gives it."""
        super().__init__(
            contract,
            device=device,
            expected_inputs=expected_inputs,
            rename={**self.lerobot_keys, **dict(rename or {})},
        )
        chosen = {**self.cameras, **self.separate_states}
        self.renames = {self.lerobot_keys[n]: key for n, key in chosen.items() if self.lerobot_keys[n] != key}
        """lerobot's key -> the policy's where they differ (``rename``, or a policy's single camera key)."""

    def inputs(
        self, observation: Mapping[str, npt.NDArray[Any]], prompts: Sequence[str] | str
    ) -> dict[str, torch.Tensor | list[str]]:
        observation, prompts = self._as_batch(observation, prompts)
        rows = next((int(np.shape(v)[0]) for v in observation.values()), 0)
        history = self._history(observation)
        flat = {k: _leading(np.asarray(v), history) for k, v in observation.items()}
        lerobot: dict[str, Any] = {}
        for key, value in preprocess_observation(observation_tree(flat)).items():
            lerobot[key] = value.reshape(rows, history, *value.shape[1:]) if history else value
        lerobot[TASK] = prompts
        processed: dict[str, Any] = self.env_preprocessor(lerobot)
        out: dict[str, torch.Tensor | list[str]] = {}
        for key, value in processed.items():
            out[self.renames.get(key, key)] = value.to(self.device) if isinstance(value, torch.Tensor) else value
        return out

    def actions(self, output: torch.Tensor, *, batched: bool = True) -> Actions:
        """The env's post-processor on every action (lerobot-eval applies it to each ``[B, A]`` step), then as usual."""
        flat = output.reshape(-1, output.shape[-1])
        processed = self.env_postprocessor({ACTION: flat})[ACTION]
        return super().actions(processed.reshape(output.shape), batched=batched)

    def _history(self, observation: Mapping[str, npt.NDArray[Any]]) -> int:
        """The length of the time axis after the batch axis, 0 without one."""
        name, value = next(iter(observation.items()))
        extra = np.ndim(value) - 1 - len(self.contract.features[name].shape)
        return int(np.shape(value)[1]) if extra == 1 else 0


def preprocess_observation(tree: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """lerobot's ``preprocess_observation`` (typed here: lerobot leaves its arrays' dtype unsaid)."""
    return _preprocess_observation(dict(tree))


def lerobot_keys(contract: Contract) -> dict[str, str]:
    """The key lerobot's ``preprocess_observation`` gives each observation feature of ``contract``."""
    keys: dict[str, str] = {}
    for name in contract.observation_features:
        feature = contract.features[name]
        probe = {name: np.zeros((1, *feature.shape), dtype=np.dtype(feature.dtype))}
        try:
            produced = list(preprocess_observation(observation_tree(probe)))
        except AssertionError as exc:  # lerobot asserts channel-last uint8 cameras
            raise PolicyError(f"lerobot's preprocess_observation refuses contract feature {name!r}: {exc}") from exc
        if len(produced) != 1:
            raise PolicyError(
                f"lerobot's preprocess_observation turns contract feature {name!r} into {produced}; expected one input"
            )
        keys[name] = produced[0]
    return keys


def observation_tree(flat: Mapping[str, npt.NDArray[Any]]) -> dict[str, Any]:
    """Contract features as the env's observation tree again (``pixels/top`` -> ``{"pixels": {"top": ...}}``).

    Read-only arrays (decoded from the wire) are copied: ``torch.from_numpy`` warns on them.
    """
    tree: dict[str, Any] = {}
    for name, array in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = array if array.flags.writeable else array.copy()
    return tree


def _leading(array: npt.NDArray[Any], history: int) -> npt.NDArray[Any]:
    """``[B, T, ...]`` -> ``[B * T, ...]`` when there is a time axis (lerobot processes one step at a time)."""
    return array.reshape(-1, *array.shape[2:]) if history else array


def _is_visual(feature: object) -> bool:
    return getattr(feature, "type", None) is FeatureType.VISUAL


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
