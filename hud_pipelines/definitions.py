"""The code location: ``dagster dev -w workspace.yaml``, ``dagster job execute -m hud_pipelines.definitions``,
``dg launch --job <pipeline>`` all load ``defs`` from here (every file in ``$HUD_PIPELINES_DIR`` or
``./pipelines``).

``digests`` says which files ``defs`` were built from (each pipeline's and the deployment file): a Celery
worker reloads this module when a run's differ (:mod:`hud_pipelines.dagster.location`). They are read
first, so a file edited while ``defs`` build reads as changed, never the reverse.
"""

from hud_pipelines.dagster.definitions import build_definitions
from hud_pipelines.dagster.location import location_digests

digests = location_digests()
defs = build_definitions()
