"""The contract: what a sim observes and accepts, shared by the sim, the agent and the dataset.

Four modules, one concept each:

- :mod:`.model`: the contract itself (features, their types, the control rate, the robot type);
- :mod:`.observations`: the observation trees envs return, flattened and walked one way;
- :mod:`.derive`: a contract derived from an env's spaces and one sample observation;
- :mod:`.file`: the editable ``contract.json``, its merge with a fresh derivation and its refresh.

Everything is importable from ``hud_pipelines.contract``.
"""

from hud_pipelines.contract.derive import (
    CAMERA_CHANNELS,
    DEFAULT_CONTROL_RATE,
    EnvContract,
    action_feature,
    check_dtype_name,
    control_rate_of,
    derive_contract,
    derive_env_contract,
    env_sources,
    looks_like_camera,
    robot_name,
    state_images,
)
from hud_pipelines.contract.file import (
    load_contract,
    merge_contract,
    refresh_contract,
    resolve_contract,
)
from hud_pipelines.contract.model import (
    ACTION,
    CAMERA_NAMES,
    CONTRACT_VERSION,
    Contract,
    Feature,
    FeatureType,
)
from hud_pipelines.contract.observations import flatten_observation, to_numpy

__all__ = [
    "ACTION",
    "CAMERA_CHANNELS",
    "CAMERA_NAMES",
    "CONTRACT_VERSION",
    "DEFAULT_CONTROL_RATE",
    "Contract",
    "EnvContract",
    "Feature",
    "FeatureType",
    "action_feature",
    "check_dtype_name",
    "control_rate_of",
    "derive_contract",
    "derive_env_contract",
    "env_sources",
    "flatten_observation",
    "load_contract",
    "looks_like_camera",
    "merge_contract",
    "refresh_contract",
    "resolve_contract",
    "robot_name",
    "state_images",
    "to_numpy",
]
