"""``hud-pipelines report``: the report rewritten from the results on disk, opened in a browser or served."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hud_pipelines.cli.selection import resolve_pipeline_file
from hud_pipelines.spec.models import PipelineSpec

if TYPE_CHECKING:
    from hud_pipelines.eval.configuration import CurrentBy
    from hud_pipelines.eval.grades import GradeRow
    from hud_pipelines.eval.outputs import EvalOutputs


def write_report(
    pipeline: str,
    *,
    pipelines_dir: Path | None = None,
    outputs_dir: Path | None = None,
    open_page: bool = False,
    serve_port: int | None = None,
) -> int:
    """Write the pipeline's report, and its grades and checks, from the results on disk as the YAML and the
    code its targets name judge them now (no sim starts); open or serve ``report.html``."""
    from hud_pipelines.eval.configuration import judged_now
    from hud_pipelines.eval.outputs import EvalOutputs, default_outputs_root
    from hud_pipelines.eval.steps import dataset_root, grades_step, report_step
    from hud_pipelines.spec.loader import load_pipeline_for_results

    spec = load_pipeline_for_results(resolve_pipeline_file(pipeline, pipelines_dir))
    outputs = EvalOutputs((outputs_dir or default_outputs_root()).resolve(), spec.name)
    if not outputs.base.is_dir():  # a mistyped --outputs would get a report of nothing run, written where none was
        print(
            f"no results of {spec.name} at {outputs.base}: run it first ({' '.join(outputs.run_command(spec))}), "
            "or give the --outputs its runs wrote to",
            file=sys.stderr,
        )
        return 2
    now = judged_now(spec, outputs)
    _, checks = grades_step(spec, outputs, now)
    dataset = dataset_root(spec, outputs, Path.cwd())
    outdated = _outdated_dataset(spec, outputs, now, dataset) if spec.dataset_enabled else None
    notes = [outdated] if outdated is not None else []
    written = report_step(spec, outputs, current=now, dataset=dataset, notes=notes)
    print(f"wrote {written.html} and {outputs.report_md}, with grades.json and checks.json beside them")
    for note in notes:
        print(f"note: {note}")
    failed = [check for check in checks if check.blocking and not check.passed]
    for check in failed:  # exit non-zero as a run would: the results as they stand do not pass
        print(f"blocking check {check.name} failed: {check.description}", file=sys.stderr)
    code = 1 if failed else 0
    if serve_port is None:
        if open_page:
            _open(written.html.as_uri())
        return code
    import functools
    from http.server import ThreadingHTTPServer

    from hud_pipelines.cli.report_server import ReportRequestHandler

    # Rooted at the outputs (not the pipeline's folder) so the links to its dataset resolve too.
    handler = functools.partial(ReportRequestHandler, directory=str(outputs.root))
    try:
        server = ThreadingHTTPServer(("127.0.0.1", serve_port), handler)
    except OSError as exc:
        why = exc.strerror or exc
        print(f"cannot serve on port {serve_port}: {why}; give another (0: any free one)", file=sys.stderr)
        return 2
    with server:
        page = written.html.relative_to(outputs.root).as_posix()
        url = f"http://127.0.0.1:{server.server_address[1]}/{page}"
        print(f"serving {outputs.root} at {url} (Ctrl-C to stop)", flush=True)
        if open_page:
            _open(url)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return code


def current_rows(pipeline: str, outputs_root: Path) -> list[GradeRow] | None:
    """The grade rows of ``pipeline`` (a name or file) as ``report`` judges them now, without writing them;
    ``None`` when it names no pipeline file here (``compare`` then reads its grades as they were written)."""
    from hud_pipelines.errors import HudPipelinesError
    from hud_pipelines.eval.configuration import judged_now
    from hud_pipelines.eval.outputs import EvalOutputs
    from hud_pipelines.eval.rows import collect_rows
    from hud_pipelines.spec.loader import load_pipeline_for_results

    try:
        spec = load_pipeline_for_results(resolve_pipeline_file(pipeline, None))
    except HudPipelinesError:
        return None
    outputs = EvalOutputs(outputs_root, spec.name)
    return collect_rows(spec, outputs, current=judged_now(spec, outputs))


def _outdated_dataset(spec: PipelineSpec, outputs: EvalOutputs, now: CurrentBy, dataset: Path) -> str | None:
    """Where the published dataset (a sweep's: each checkpoint's) holds episodes the grades no longer count (the
    configuration changed since the run that published it, or a later run's blocking check held its dataset back):
    ``report`` writes no dataset. ``None`` where none does."""
    from hud_pipelines.dataset.part import read_episode_records
    from hud_pipelines.eval.publishing import member_dataset
    from hud_pipelines.eval.rows import collect_rows, sweep_members

    if spec.is_sweep:
        members = sweep_members(spec, outputs, now)
        judged = [(member_dataset(dataset, m.label), collect_rows(m.spec, m.outputs, current=c)) for m, c in members]
    else:
        judged = [(dataset, collect_rows(spec, outputs, current=now))]
    said: list[str] = []
    for folder, rows in judged:
        records = read_episode_records(folder) if folder is not None else []
        published = {str(record["trace_id"]) for record in records if record.get("trace_id")}
        extra = published - {row.trace_id for row in rows if row.trace_id}
        if extra:
            said.append(f"{folder} holds {len(extra)} of its {len(published)} episode(s)")
    if not said:
        return None
    return (
        f"the published dataset {'; '.join(said)} from results these grades no longer count (an earlier run's: the "
        "configuration changed since, or a later run's dataset was held back): a run that passes its blocking checks "
        "publishes it again"
    )


def _open(url: str) -> None:
    """Open ``url`` in a browser, or say there is none (a headless machine): it was silent."""
    import webbrowser

    if not webbrowser.open(url):
        print(f"no browser to open here: open {url} where there is one", file=sys.stderr)
