"""What ``hud-pipelines run`` checks of a pipeline before it starts anything: the deep checks that run none of
the user's code.

``validate`` resolves the sim factory, which imports its module in the calling process; a run leaves that to
the sim's own process (a sim may want the process to itself, or run under another interpreter), where an
unknown factory is the sim's start-up error, one per instance. Everything that reading can tell is checked
here instead, at the YAML line that names it, so that a typo does not start a Dagster run and a sim per
instance to end in an errored row per slot: a ``file.py:callable`` or ``module:callable`` target's file and
name, read from its source (a module whose names cannot be read is left to the run); a registry id that
gymnasium's own registry does not hold (a namespaced one, ``gym_pusht/PushT-v0``, is registered by its
package in the sim: left to it); the arguments of a scripted or torch policy; a checkpoint file or policy
folder that is not there; the contract file against the dataset section and a constant action; the sim's
interpreter; the fleet file.
"""

from __future__ import annotations

import dataclasses

from hud_pipelines.spec.deep import contract_problems, grader_problems, policy_problems, sweep_source_problems
from hud_pipelines.spec.document import YamlDocument, read_document
from hud_pipelines.spec.models import PipelineSpec
from hud_pipelines.spec.problems import Problem
from hud_pipelines.spec.sections import is_file_target
from hud_pipelines.spec.sim_files import data_file_problems, fleet_file_problems, python_problems
from hud_pipelines.spec.target_check import target_problem

RUN_CONFIGURATION = "the run's configuration (run config or deployment file)"
"""Where a problem of a section the run's resources replaced is: no line of the pipeline's file holds it."""


def runnable_problems(spec: PipelineSpec, document: YamlDocument, deployed: PipelineSpec | None) -> list[Problem]:
    """The problems of a valid spec that would fail its run, as far as they show without running its code.

    ``deployed``: the spec as the run will have it. A sim section a deployment file replaces with a sim served
    elsewhere (in place of the YAML's spawned one, whose module and files are on that machine) is not judged here,
    one it replaces with another spawned sim has its factory judged as the configuration's;
    a policy or graders that the run's configuration replaces run in the run's own processes, as the YAML's would:
    they are judged, said as the configuration's. ``None`` (the deployment could not be applied, which the run
    refuses in its own words) judges none that it may.
    """

    def kept(*sections: str) -> bool:
        return deployed is not None and all(getattr(deployed, s) == getattr(spec, s) for s in sections)

    problems: list[Problem] = []
    if kept("sim"):
        problems += [*python_problems(spec, document), *fleet_file_problems(spec, document)]
        problems += data_file_problems(spec, document)
        problems += _factory_problems(spec, document)
    if kept("sim", "agent"):
        problems += contract_problems(spec, document)
    policy_kept = deployed is not None and deployed.agent.policy == spec.agent.policy  # agent: {torch_threads: 4}
    if policy_kept:
        problems += [*policy_problems(spec, document, run_code=False), *sweep_source_problems(spec, document)]
    if kept("graders"):
        problems += grader_problems(spec, document, run_code=False)
    # a run configuration's policy or graders run in the run's own processes: their targets are judged as the
    # YAML's are, said as the configuration's (no line of the file holds them)
    overrides = read_document("{}", RUN_CONFIGURATION, {})[0]
    replaced: list[Problem] = []
    if deployed is not None and overrides is not None and not policy_kept:
        replaced += policy_problems(deployed, overrides, run_code=False)
    if deployed is not None and overrides is not None and not kept("graders"):
        replaced += grader_problems(deployed, overrides, run_code=False)
    if deployed is not None and overrides is not None and not kept("sim") and deployed.sim.spawned:
        replaced += _factory_problems(deployed, overrides)  # another sim spawned here: its factory is read here too
        replaced += data_file_problems(deployed, overrides)
    return [*problems, *(dataclasses.replace(p, line=0, column=0, source_line=None) for p in replaced)]


def _factory_problems(spec: PipelineSpec, document: YamlDocument) -> list[Problem]:
    factory = spec.factory
    if factory is None or spec.sim.lerobot_env is not None:
        return []  # a lerobot env config is resolved while loading; its registry id is its package's, in the sim
    if ":" in factory:  # a file is read whichever interpreter runs it; a module of the sim's own one is the sim's
        if spec.sim.python is not None and not is_file_target(factory):
            return []
        message = target_problem(spec.resolve_target(factory), spec.base_dir, run_code=False)
    elif "/" in factory:
        return []  # a namespaced id, registered by its package in the sim
    else:
        from hud_pipelines.sim.factory import unknown_registry_id

        message = unknown_registry_id(factory)
    return [] if message is None else [document.problem(("sim", "factory"), message)]
