"""Load what a ``module:attribute`` or ``path/to/file.py:attribute`` target names.

Pipelines name sim factories, scripted controllers, torch modules and graders this way. A relative
file path is read from ``base_dir`` (the YAML's directory). A module that is not importable from
``sys.path`` is looked up in ``base_dir``, its parents and the working directory, because a pipeline
usually sits in a project whose own packages (``envs/`` for example) are not installed. Every
failure is raised as the caller's error type, naming the target and, for a missing attribute, the
closest names the module has. This module is light: the sim child imports it.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hud_pipelines.errors import HudPipelinesError

log = logging.getLogger(__name__)


def load_target(
    spec: str, *, base_dir: Path | None = None, error: type[HudPipelinesError] = HudPipelinesError, what: str = "target"
) -> Any:
    """The object ``spec`` names; every failure is an ``error`` naming ``what`` and ``spec``."""
    base = (base_dir or Path.cwd()).resolve()
    module_part, sep, attribute = spec.rpartition(":")
    if not sep or not module_part or not attribute:
        raise error(f"{what} {spec!r} must look like 'package.module:name' or 'path/to/file.py:name'")
    if module_part.endswith(".py"):
        module = _load_file(module_part, spec, base, error, what)
    else:
        module = _import(module_part, spec, base, error, what)
    _as_on_disk(module)
    try:
        return getattr(module, attribute)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        hint = difflib.get_close_matches(attribute, names, n=3)
        suggestion = f"; did you mean {', '.join(hint)}?" if hint else ""
        raise error(f"{what} {spec!r}: {module_part} has no attribute {attribute!r}{suggestion}") from None


def _import(module_name: str, spec: str, base: Path, error: type[HudPipelinesError], what: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".", 1)[0]
        if exc.name is None or exc.name.split(".", 1)[0] != top:
            raise error(f"{what} {spec!r}: importing {module_name!r} failed: {exc}") from exc
        for root in (base, *base.parents, Path.cwd()):
            if (root / top).is_dir() or (root / f"{top}.py").is_file():
                if str(root) not in sys.path:
                    sys.path.insert(0, str(root))
                return importlib.import_module(module_name)
        raise error(f"{what} {spec!r}: cannot import module {module_name!r} ({exc})") from exc


def _load_file(path_text: str, spec: str, base: Path, error: type[HudPipelinesError], what: str) -> Any:
    path = Path(path_text)
    path = (path if path.is_absolute() else base / path).resolve()
    if not path.is_file():
        siblings = [p.name for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
        hint = difflib.get_close_matches(path.name, siblings, n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise error(f"{what} {spec!r}: file {path} does not exist{suggestion}")
    if str(path.parent) not in sys.path:  # as for a script: the files beside it import; last, so they shadow nothing
        sys.path.append(str(path.parent))
    shadowed = shadowed_sibling(path)
    if shadowed is not None:
        raise error(f"{what} {spec!r}: {shadowed}")
    module_name = f"hud_pipelines_target_{path.stem}_{abs(hash(path)) & 0xFFFFFF:x}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise error(f"{what} {spec!r}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def target_sources(spec: str, base_dir: Path) -> list[Path]:
    """The files a target's code is read from, found without importing anything: its module's file and
    the modules beside it that the file imports (one level: a helper's own helpers are not followed).

    ``[]`` for a registry id or a module found nowhere here (one only a sim's own interpreter sees).
    Looked up as :func:`load_target` imports: ``sys.path`` first, then ``base_dir``, its parents and
    the working directory.
    """
    module_part, sep, _ = spec.rpartition(":")
    if not sep or not module_part:
        return []
    if module_part.endswith(".py"):
        path = Path(module_part).expanduser()
        path = path if path.is_absolute() else base_dir / path
        found = path.resolve() if path.is_file() else None
    else:
        found = _module_file(module_part.split("."), base_dir.resolve())
    if found is None:
        return []
    beside = (
        _sibling_module(found.parent, name) for name in sorted(_imported_top_names(found) - sys.stdlib_module_names)
    )
    return [found, *(file for file in beside if file is not None and file != found)]


_LOADED: dict[str, str] = {}
"""Module name -> the digest of its file as this process last executed it (for targets and their helpers)."""


def _as_on_disk(module: ModuleType) -> None:
    """Execute ``module`` again if its file, or a helper beside it that it imports, changed since it ran here.

    A Celery worker runs unit after unit in one process, so a policy file edited between two runs would
    otherwise keep running as first imported, while the result's provenance records the digest of the
    edited file (:mod:`hud_pipelines.eval.sources`). The files looked at are the ones digested there:
    the target's own and the modules beside it that it imports. The source is compiled afresh, never
    from a bytecode cache (an edit within the same second keeps the file's size and mtime alike).
    """
    path = _file_of(module)
    if path is None:
        return
    stale = False
    for name in sorted(_imported_top_names(path) - sys.stdlib_module_names):
        helper = sys.modules.get(name)
        helper_path = _file_of(helper) if helper is not None else None
        if helper is not None and helper_path is not None and helper_path == _sibling_module(path.parent, name):
            stale |= _execute_if_changed(helper, helper_path)
    if _execute_if_changed(module, path, force=stale):  # after its helpers: it imports their new names
        log.info("%s changed since this process imported it: executed it again", path)


def _execute_if_changed(module: ModuleType, path: Path, *, force: bool = False) -> bool:
    digest = code_digest(path)
    known = _LOADED.setdefault(module.__name__, digest)
    if known == digest and not force:
        return False
    exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)  # its own source, as its import ran it
    _LOADED[module.__name__] = digest
    return True


def _file_of(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if isinstance(file, str) and file.endswith(".py") else None


CODE_DIGEST_CHARS = 16
"""How much of a source file's sha256 its digest keeps (a short name for one version of the code)."""


def code_digest(file: Path) -> str:
    """A short sha256 of a source file, or ``unreadable`` (loading the target reports why, naming the file).

    The one digest of code: the eval's sources (:mod:`hud_pipelines.eval.sources`) and a sim's own record
    of itself (:mod:`hud_pipelines.sim.identity`) compare by it.
    """
    try:
        return hashlib.sha256(file.read_bytes()).hexdigest()[:CODE_DIGEST_CHARS]
    except OSError:
        return "unreadable"


def _module_file(parts: list[str], base: Path) -> Path | None:
    for root in (*(Path(entry) for entry in sys.path), base, *base.parents, Path.cwd()):
        where = root.joinpath(*parts)
        for candidate in (where.parent / f"{where.name}.py", where / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def shadowed_sibling(path: Path) -> str | None:
    """Why ``path`` would import another module than the one beside it of the same name (``None``: it would not).

    A process holds one module per name: ``helpers.py`` beside a second pipeline's factory resolves
    to the first pipeline's ``helpers`` once that is loaded, and an installed ``utils`` wins over a
    ``utils.py`` beside the file (the folder goes last on ``sys.path``). Either would run other code
    than the file's author wrote, silently; the names it imports are read from its source. Left
    alone: the standard library's names (a ``random.py`` beside a file that imports ``random`` is
    almost always unrelated to it), and the file's own name (``metaworld.py`` wrapping the
    ``metaworld`` package imports the package: the file loads under a name of its own).
    """
    me = path.resolve()
    for name in sorted(_imported_top_names(path) - sys.stdlib_module_names):
        sibling = _sibling_module(path.parent, name)
        if sibling is None or sibling == me:
            continue
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if found is None or not found.has_location or not found.origin:
            continue
        origin = Path(found.origin).resolve()
        if origin != sibling:
            return (
                f"{path.name} imports {name!r}, which is {sibling} beside it, but {name!r} resolves to "
                f"{origin} in this process (one module per name: another pipeline's file or an installed "
                f"package of that name); rename one of them, or make the folder a package"
            )
    return None


def _imported_top_names(path: Path) -> set[str]:
    """The top-level module names a file's absolute imports name, anywhere in it (functions too)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()  # loading the module reports it, with its line or the file's error
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".", 1)[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".", 1)[0])
    return names


def _sibling_module(folder: Path, name: str) -> Path | None:
    """The file that ``import name`` finds in ``folder``: ``name.py`` or ``name/__init__.py``."""
    for candidate in (folder / f"{name}.py", folder / name / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None
