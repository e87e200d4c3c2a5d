"""``hud-pipelines``: validate, run and serve evals from the command line.

Subcommands import what they need lazily, so ``hud-pipelines serve`` (the sim child) never pays for
torch, lerobot or dagster, and ``validate`` never starts a sim.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path


def _serve(args: argparse.Namespace) -> int:
    from hud_pipelines.sim.serve import run

    return run(args)


def _validate(args: argparse.Namespace) -> int:
    from hud_pipelines.cli.validate import run_validate

    return run_validate(args)


def _schema(args: argparse.Namespace) -> int:
    from hud_pipelines.cli.validate import run_schema

    return run_schema(args)


def _run(args: argparse.Namespace) -> int:
    from hud_pipelines.cli.log_lines import plain_package_log
    from hud_pipelines.cli.run import run_pipeline

    with plain_package_log():  # an instance's failure is a line of the run's output, as it happens
        return run_pipeline(
            args.pipeline,
            pipelines_dir=args.pipelines_dir,
            outputs_dir=args.outputs,
            partitions=args.partition or None,
            quiet=args.quiet,
            checkpoints=args.checkpoint or None,
            rerun=args.rerun,
            queue=args.queue,
        )


def _report(args: argparse.Namespace) -> int:
    from hud_pipelines.cli.report import write_report

    return write_report(
        args.pipeline,
        pipelines_dir=args.pipelines_dir,
        outputs_dir=args.outputs,
        open_page=args.open,
        serve_port=args.serve,
    )


def _compare(args: argparse.Namespace) -> int:
    from hud_pipelines.cli.report import current_rows
    from hud_pipelines.eval.comparison import run_compare

    return run_compare(args, judge=current_rows)


def _contract(args: argparse.Namespace) -> int:
    from hud_pipelines.cli.contract import write_contract

    return write_contract(args.pipeline, pipelines_dir=args.pipelines_dir, out=args.out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hud-pipelines", description="Declarative evaluation of robot policies in simulation."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from hud_pipelines.cli.validate import add_schema_arguments, add_validate_arguments
    from hud_pipelines.sim.serve import add_arguments as add_serve_arguments

    validate = commands.add_parser("validate", help="check pipeline files; every problem with file:line")
    add_validate_arguments(validate)
    validate.set_defaults(handler=_validate)

    run = commands.add_parser("run", help="run a pipeline's Dagster job on the local instance, with a summary")
    _add_pipeline(run)
    _add_outputs_root(run, "outputs root")
    run.add_argument("--partition", action="append", metavar="KEY", help="run only these instances (repeatable)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--checkpoint", action="append", metavar="LABEL", help="a sweep: evaluate only this checkpoint (repeatable)"
    )
    run.add_argument("--rerun", action="store_true", help="a sweep: run pairs again that already have a current result")
    run.add_argument(
        "--queue", default=None, help="on Celery workers: this run's units go to this queue (default: the deployment's)"
    )
    run.set_defaults(handler=_run)

    schema = commands.add_parser("schema", help="print the JSON Schema of pipeline files (or the YAML reference)")
    add_schema_arguments(schema)
    schema.set_defaults(handler=_schema)

    contract = commands.add_parser("contract", help="derive (or merge) a pipeline's contract.json and show it")
    _add_pipeline(contract)
    contract.add_argument(
        "--out", type=Path, default=None, help="where to write it (default: the pipeline's sim.contract)"
    )
    contract.set_defaults(handler=_contract)

    report = commands.add_parser(
        "report", help="write a pipeline's report (report.html, report.md) from its results; open or serve it"
    )
    _add_pipeline(report)
    _add_outputs_root(report, "outputs root")
    report.add_argument("--open", action="store_true", help="open report.html in a browser")
    report.add_argument(
        "--serve",
        type=int,
        nargs="?",
        const=0,
        default=None,
        metavar="PORT",
        help="serve the outputs folder over HTTP on 127.0.0.1 (any free port without PORT)",
    )
    report.set_defaults(handler=_report)

    paired = commands.add_parser(
        "compare", help="compare two result sets on their paired episodes (McNemar, exact intervals, a verdict)"
    )
    paired.add_argument("candidate", help="a grades.json, an outputs/<name> directory, or a pipeline name")
    paired.add_argument("baseline", help="the same for the baseline")
    for side in ("candidate", "baseline"):
        paired.add_argument(
            f"--{side}-checkpoint",
            metavar="LABEL",
            help=f"the checkpoint of a sweep's results to take as the {side} (default: the sweep's candidate)",
        )
    _add_outputs_root(paired, "outputs root for names")
    paired.add_argument("--alpha", type=_open_unit, default=0.05, help="significance level (default 0.05)")
    paired.add_argument(
        "--min-effect",
        type=_unit_above_zero,
        default=0.1,
        help="success difference to size the sample for (default 0.1)",
    )
    paired.add_argument("--json", action="store_true", help="print the comparison as JSON")
    paired.add_argument(
        "--fail-if-worse",
        action="store_true",
        help="exit 1 when the candidate is significantly worse, or would be had its errored episodes failed (CI)",
    )
    paired.set_defaults(handler=_compare)

    serve = commands.add_parser("serve", help="serve a sim over the wire (prints one JSON ready line)")
    add_serve_arguments(serve)
    serve.set_defaults(handler=_serve)
    for command in commands.choices.values():  # an unknown option is said with its command's usage (see main)
        command.set_defaults(command_parser=command)
    return parser


def _open_unit(text: str) -> float:
    """A level strictly between 0 and 1 (``--alpha``)."""
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return value


def _unit_above_zero(text: str) -> float:
    """A difference in ``(0, 1]`` (``--min-effect``)."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def _add_pipeline(parser: argparse.ArgumentParser) -> None:
    """The pipeline a command acts on, a file or a name, and where its name is looked up."""
    parser.add_argument("pipeline", help="a pipeline file, or the name of a pipeline in --pipelines-dir")
    parser.add_argument(
        "--pipelines-dir",
        type=Path,
        default=None,
        help="where pipeline names are looked up (default $HUD_PIPELINES_DIR, else ./pipelines)",
    )


def _add_outputs_root(parser: argparse.ArgumentParser, what: str) -> None:
    """``--outputs``, the root under which every pipeline's outputs lie (``what`` says what it is for here)."""
    parser.add_argument(
        "--outputs", type=Path, default=None, help=f"{what} (default $HUD_PIPELINES_OUTPUTS or ./outputs)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    from hud_pipelines.errors import HudPipelinesError

    # pygame (imported by gym-pusht) warns about pkg_resources on import: noise for CLI users.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)

    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # argparse says it with the top-level usage, which lists no option of the command
        command_parser: argparse.ArgumentParser = args.command_parser
        command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except HudPipelinesError as exc:
        print(f"hud-pipelines {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hud-pipelines {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # its reader stopped reading (`| head`): what it read is all it wanted, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit goes nowhere
        return 1


if __name__ == "__main__":
    sys.exit(main())
