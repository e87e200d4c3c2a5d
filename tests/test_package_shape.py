"""The package's shape stays what docs/architecture.md promises: small modules, a thin top level, no import cycle.

Read from the source text (``ast``), so these run in milliseconds and import nothing. Imports inside
functions and under ``TYPE_CHECKING`` count too: a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hud_pipelines"
MAX_MODULE_LINES = 400
MAX_TOP_LEVEL_MODULES = 6
MAX_CASTS = 97
"""Below the 98 ``cast()`` calls the package had before its renovation."""
MAX_IGNORE_PRAGMAS = 23
"""Below the 24 ``type: ignore`` / ``pyright: ignore`` pragmas it had then."""


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its ``__init__``)."""
    modules: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its text."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(m for a in node.names if (m := known(a.name)) is not None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                target = known(f"{base}.{alias.name}") or known(base)
                if target is not None:
                    found.add(target)
    found.discard(module)
    return found


def test_no_module_is_longer_than_the_limit() -> None:
    lengths = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in PACKAGE.rglob("*.py")}
    too_long = {str(p.relative_to(PACKAGE.parent)): n for p, n in lengths.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"


def test_the_top_level_holds_few_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules directly under hud_pipelines/: {top}"


def test_no_two_modules_import_each_other_even_lazily() -> None:
    modules = _modules()
    graph = {module: _imported(module, path, modules) for module, path in modules.items()}
    assert graph["hud_pipelines.agent.factory"], "the walk finds imports (inside functions too)"
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"an import cycle: {' -> '.join(exc.args[1])}") from None


def test_casts_and_ignore_pragmas_stay_below_where_they_were() -> None:
    texts = [path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")]
    casts = sum(len(re.findall(r"\bcast\(", text)) for text in texts)
    pragmas = sum(len(re.findall(r"#\s*(?:type|pyright):\s*ignore", text)) for text in texts)
    assert casts <= MAX_CASTS, f"{casts} cast() calls"
    assert pragmas <= MAX_IGNORE_PRAGMAS, f"{pragmas} ignore pragmas"


DOCS = [PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").glob("*.md"))]
DOC_IMPORT = re.compile(r"^from (hud_pipelines[\w.]*) import ([\w, ]+)$", re.MULTILINE)


def _top_level_names(path: Path) -> set[str]:
    """What a module defines or imports at its top level (what ``from module import name`` finds there; the
    package root's lazy exports are imported under ``TYPE_CHECKING`` for the type checker)."""
    names: set[str] = set()
    body = ast.parse(path.read_text()).body
    for node in [*body, *(child for block in body if isinstance(block, ast.If) for child in block.body)]:
        match node:
            case ast.FunctionDef() | ast.AsyncFunctionDef() | ast.ClassDef():
                names.add(node.name)
            case ast.Assign():
                names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
            case ast.AnnAssign(target=ast.Name(id=name)):
                names.add(name)
            case ast.Import() | ast.ImportFrom():
                names |= {alias.asname or alias.name.partition(".")[0] for alias in node.names}
            case _:
                pass
    return names


def test_every_import_the_docs_show_names_what_the_package_has() -> None:
    modules = _modules()
    shown = [(doc.name, m[1], m[2]) for doc in DOCS for m in DOC_IMPORT.finditer(doc.read_text())]
    assert len(shown) >= 5, shown
    missing = [
        f"{doc}: from {module} import {name}"
        for doc, module, names in shown
        for name in (n.strip() for n in names.split(","))
        if module not in modules
        or (name not in _top_level_names(modules[module]) and f"{module}.{name}" not in modules)
    ]
    assert not missing
