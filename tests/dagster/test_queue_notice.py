"""A step no worker takes is said once a queue, and never of a queue whose steps workers take.

Fakes of the broker's answers, beside the real thing: ``tests/dagster/test_celery.py`` runs a real run with a real
Redis and no worker on its control queue, and reads the notice in its output.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hud_pipelines.dagster.step_recovery import LeasedResult, QueueWatch


class _Queued:
    """A Celery result no worker has taken."""

    id = "task"
    state = "PENDING"

    def ready(self) -> bool:
        return False


def _submitted(queue: str, queues: QueueWatch, said: list[str]) -> LeasedResult:
    context: Any = SimpleNamespace(
        log=SimpleNamespace(warning=said.append),
        instance=SimpleNamespace(get_records_for_run=lambda *args, **kwargs: SimpleNamespace(records=[])),
        dagster_run=SimpleNamespace(run_id="run"),
    )
    watch: Any = SimpleNamespace(check=lambda **kwargs: None, down=False, restarted_since=lambda since: False)
    client: Any = SimpleNamespace(get=lambda key: None)  # no lease
    executor: Any = SimpleNamespace(lease_s=0.0, lost_retries=0)
    step: Any = SimpleNamespace(key=f"unit_{queue}_{len(said)}")
    return LeasedResult(_Queued, client, watch, context, step, attempt=0, executor=executor, queue=queue, queues=queues)


def test_a_queue_no_worker_takes_is_said_once_and_a_busy_queues_waiting_units_are_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said: list[str] = []
    queues = QueueWatch()
    for _ in range(3):  # the units of one queue: said once
        assert not _submitted("gpu", queues, said).ready()
    assert len(said) == 1
    assert 'on queue "gpu" with no worker taking it' in said[0]
    assert "celery -A hud_pipelines.dagster.worker worker --queues gpu" in said[0]
    assert said[0] in caplog.text, "and on the console, which shows no Dagster log line below CRITICAL"
    queues.taken.add("cpu")  # a worker took one of its steps: the others wait their turn
    assert not _submitted("cpu", queues, said).ready()
    assert len(said) == 1
