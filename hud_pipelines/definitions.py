"""The code location: ``dagster dev -w workspace.yaml``, ``dagster job execute -m hud_pipelines.definitions``,
``dg launch --job <pipeline>`` all load ``defs`` from here (every file in ``$HUD_PIPELINES_DIR`` or
``./pipelines``)."""

from hud_pipelines.dagster.definitions import build_definitions

defs = build_definitions()
