"""The policy types lerobot can build, read from its source: a ``type`` typo is said by ``validate``, at its line.

lerobot registers each policy's config under its name (``@PreTrainedConfig.register_subclass("act")``); importing
lerobot to ask its registry takes seconds, so the names are read from the files that register them. Where lerobot
is not installed, registers its policies some other way, or a plugin package may add types, nothing is said: the
run's own error stands.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from functools import cache
from pathlib import Path

from hud_pipelines.spec.agent import LeRobotPolicyConfig
from hud_pipelines.spec.document import YamlDocument
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem, did_you_mean

_REGISTERED = re.compile(r"register_subclass\(\s*[\"']([\w.-]+)[\"']")


@cache
def lerobot_policy_types() -> frozenset[str]:
    """The names lerobot's policies register their configs under; empty when that cannot be read, or when a
    third-party policy package (``lerobot_policy_*``) may register more."""
    plugins = (dist.metadata.get("Name") or "" for dist in importlib.metadata.distributions())
    if any(name.replace("-", "_").startswith("lerobot_policy_") for name in plugins):
        return frozenset()
    try:
        found = importlib.util.find_spec("lerobot")
    except (ImportError, ValueError):
        return frozenset()
    folders = list(found.submodule_search_locations or []) if found is not None else []
    names: set[str] = set()
    for folder in folders:
        for file in Path(folder, "policies").glob("*/configuration_*.py"):
            try:
                names.update(_REGISTERED.findall(file.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError):
                continue
    return frozenset(names)


def lerobot_type_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    """A LeRobot policy ``type`` that lerobot does not know (``actt``), with the closest it does."""
    policy = spec.agent.policy
    if not isinstance(policy, LeRobotPolicyConfig) or policy.type is None or policy.path or policy.checkpoints:
        return []  # weights from a folder: its own config says the type, and ``type`` is not read
    known = lerobot_policy_types()
    if not known or policy.type in known:
        return []
    message = f"lerobot has no policy type {policy.type!r}{did_you_mean(policy.type, sorted(known))}"
    return [document.problem(("agent", "policy", "type"), f"{message}; it has: {', '.join(sorted(known))}")]
