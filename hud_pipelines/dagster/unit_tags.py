"""The names the eval's units and the executor that runs them on workers agree on."""

QUEUE_TAG = "dagster-celery/queue"
"""dagster-celery's op tag: the queue a step is sent to."""
UNIT_TAG = "hud_pipelines/unit"
"""Op tag of the eval's units: a lost unit always gets another attempt (to run again or to record the loss)."""
RESULT_METADATA = "result"
"""Metadata key of a unit's observation: the path of the instance's result file."""
