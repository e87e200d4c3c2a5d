"""The code location: ``dagster dev -w workspace.yaml``, ``dagster job execute -m hud_pipelines.definitions``,
``dg launch --job <pipeline>`` all load ``defs`` from here (every file in ``$HUD_PIPELINES_DIR`` or
``./pipelines``).

``digests`` says which files ``defs`` were built from (each pipeline's and the deployment file, and the
whole location's): a Celery worker reloads this module when a run's differ
(:mod:`hud_pipelines.dagster.location`). They are read before ``defs`` are built, so a file edited meanwhile
reads as changed, never the reverse, and set after, so a build that fails leaves the digests of the ``defs``
this module still holds.
"""

from hud_pipelines.dagster.definitions import build_definitions
from hud_pipelines.dagster.location import location_digests

_read = location_digests()
defs = build_definitions()
digests = _read
