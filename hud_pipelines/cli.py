"""``hud-pipelines``: validate, run and serve evals from the command line.

Subcommands import what they need lazily so that ``hud-pipelines serve`` (the sim child) never pays
for torch, lerobot or dagster.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _serve(args: argparse.Namespace) -> int:
    from hud_pipelines.sim.serve import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hud-pipelines", description="Declarative evaluation of robot policies in simulation.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from hud_pipelines.sim.serve import add_arguments as add_serve_arguments

    serve = commands.add_parser("serve", help="serve a sim over the wire (prints one JSON ready line)")
    add_serve_arguments(serve)
    serve.set_defaults(handler=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
