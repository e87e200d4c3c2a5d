"""Load what a ``module:attribute`` or ``path/to/file.py:attribute`` target names.

Pipelines name sim factories, scripted controllers, torch modules and graders this way. A relative
file path is read from ``base_dir`` (the YAML's directory). A module is the project's own first: a
pipeline usually sits in a project whose packages (``envs/`` for example) are not installed, and the
folder among ``base_dir``, its parents and the working directory that holds the module's top-level
package goes first on ``sys.path`` (:func:`project_first`), as ``python -m`` puts the working
directory first; otherwise a package of the same name that ``sys.path`` already reaches (an editable
install's checkout, an installed one) would win, in one process and not in another. Every failure
is raised as the caller's error type, naming the target and, for a missing attribute, the closest
names the module has. This module is light: the sim child imports it.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable
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
    _as_on_disk(target_sources(spec, base))
    try:
        return getattr(module, attribute)
    except AttributeError:
        # what the module holds, read without running a module-level __getattr__ for each name
        held = vars(module)
        names = [n for n in dir(module) if not n.startswith("_") and (n not in held or not not_callable(held[n]))]
        hint = difflib.get_close_matches(attribute, names, n=3)
        suggestion = f"; did you mean {', '.join(hint)}?" if hint else ""
        raise error(f"{what} {spec!r}: {module_part} has no attribute {attribute!r}{suggestion}") from None


def one_argument_refused(fn: Callable[..., Any], argument: str = "the episode dict") -> str | None:
    """Why ``fn`` cannot be called with one positional argument (``argument``: a callable grader's episode dict, a
    scripted policy function's observation batch), or ``None``: also where its signature cannot be read (a builtin),
    for the call to say."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None)
    except TypeError as exc:
        return f"takes {signature} but is called with one argument, {argument} ({exc})"
    return None


def not_callable(value: object) -> str | None:
    """What ``value`` is when no target can be it (a module, a constant); ``None`` for anything that can be called
    or is a policy object (it has ``infer``: looked up statically, as no ``__getattr__`` of the object's may run)."""
    try:
        inspect.getattr_static(value, "infer")
    except AttributeError:
        pass
    else:
        return None
    if callable(value):
        return None
    return "a module" if inspect.ismodule(value) else f"a value of type {type(value).__name__}"


def _import(module_name: str, spec: str, base: Path, error: type[HudPipelinesError], what: str) -> ModuleType:
    clash = project_first(module_name, base)
    if clash is not None:
        raise error(f"{what} {spec!r}: cannot import module {module_name!r}: {clash}")
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".", 1)[0]
        if exc.name is None or exc.name.split(".", 1)[0] != top:
            raise error(f"{what} {spec!r}: importing {module_name!r} failed: {exc}") from exc
        raise error(f"{what} {spec!r}: cannot import module {module_name!r} ({exc})") from exc


def project_root(top: str, base: Path) -> Path | None:
    """The project folder a target's top-level module ``top`` is found in: the first of ``base`` (the YAML's
    folder), its parents and the working directory holding ``top.py`` or a ``top/`` package (``None``: none does)."""
    for root in (base, *base.parents, Path.cwd()):
        if (root / top).is_dir() or (root / f"{top}.py").is_file():
            return root
    return None


def project_first(module_name: str, base: Path) -> str | None:
    """Put the project folder of ``module_name`` (:func:`project_root`) first on ``sys.path``, so the project's
    own package wins over one of the same name elsewhere; why the module this process already holds under its
    top-level name is another one (``None``: it is the project's, none is held yet, or the project has none).

    The process and the sim child import a target the same way, whatever imported first: ``hud-pipelines``
    (a console script) puts no working directory on ``sys.path``, ``python -m`` does, and an editable install
    puts its checkout there, whose own ``envs`` package would shadow a project's ``envs``.
    """
    top = module_name.split(".", 1)[0]
    root = project_root(top, base)
    if root is None:
        return None
    with contextlib.suppress(ValueError):
        sys.path.remove(str(root))
    sys.path.insert(0, str(root))
    held = sys.modules.get(top)
    own = root / top if (root / top / "__init__.py").is_file() else root / f"{top}.py"
    if held is None or not own.exists():  # a namespace folder: any regular package of the name wins, as in Python
        return None
    places = [str(place) for place in getattr(held, "__path__", None) or [getattr(held, "__file__", None)] if place]
    if any(Path(place).resolve() == own.resolve() for place in places):
        return None
    where = ", ".join(places) or "nowhere on disk"
    return (
        f"the project's {top!r} is {own}, but this process imported {top!r} from {where} before (one module per "
        "name: an installed package or another checkout of that name); rename one of them"
    )


def _load_file(path_text: str, spec: str, base: Path, error: type[HudPipelinesError], what: str) -> ModuleType:
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


MAX_SOURCES = 256
"""The most files a target's sources are followed to (a project, not an installed library, is what they cover)."""


def target_sources(spec: str, base_dir: Path) -> list[Path]:
    """The files a target's code is read from, found without importing anything: its module's file, then every
    file of the project it imports, and theirs in turn (the target first, then in the order they are met).

    An import is followed where it resolves to a file here: an absolute one beside the importing file (as
    for a script) or under the target's root (the folder its top package sits in, or its own folder), a
    relative one within its package; package ``__init__`` files count. The standard library and installed
    packages are not followed (their versions are recorded instead), nor is code found nowhere here: ``[]``
    for a module only a sim's own interpreter sees, a plain registry id, or one whose namespace is installed;
    an id ``ns/Env-v0`` whose package ``ns`` is the project's is read as that package. Looked up as :func:`load_target`
    imports: the project's folder of the module first (:func:`project_first`), then ``sys.path``, ``base_dir``,
    its parents and the working directory.
    """
    module_part, sep, _ = spec.rpartition(":")
    registry = not sep and "/" in spec  # an id ``ns/Env-v0``: the project's package ``ns`` registers and holds it
    if registry:
        module_part = spec.split("/", 1)[0]
        if not module_part.isidentifier() or module_part in sys.stdlib_module_names:
            return []
    elif not sep or not module_part:
        return []
    if module_part.endswith(".py"):
        path = Path(module_part).expanduser()
        path = path if path.is_absolute() else base_dir / path
        found = path.resolve() if path.is_file() else None
        root = found.parent if found is not None else None
    else:
        parts = module_part.split(".")
        found = _module_file(parts, base_dir.resolve())
        root = None if found is None else found.parents[len(parts) - (found.name != "__init__.py")]
    if found is None or root is None:
        return []
    if _installed(found):  # a library's own imports are its business (its version is recorded for a registry id)
        return [] if registry else [found]
    packages = _dotted(root, module_part.split(".")[:-1]) if not module_part.endswith(".py") else []
    files = dict.fromkeys([found, *packages])  # importing ``a.b.c`` runs a's and a.b's ``__init__`` first
    queue = list(files)
    while queue and len(files) < MAX_SOURCES:
        for imported in _imported_files(queue.pop(0), root):
            if imported not in files and not _installed(imported):
                files[imported] = None
                queue.append(imported)
    return list(files)


def _imported_files(path: Path, root: Path) -> list[Path]:
    """The files of this project that ``path``'s imports (anywhere in it, functions too) would load."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []  # loading the module reports it, with its line or the file's error
    found: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _absolute(alias.name.split("."), path.parent, root)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:  # ``from pkg import name``: name may be a module of pkg
                found += _absolute([*node.module.split("."), alias.name], path.parent, root)
        elif isinstance(node, ast.ImportFrom):
            package = path.parents[node.level - 1] if node.level <= len(path.parents) else None
            if package is None:
                continue
            prefix = node.module.split(".") if node.module else []
            for alias in node.names:
                found += _dotted(package, [*prefix, alias.name])
    return found


OWN_PACKAGE = __name__.partition(".")[0]
"""This package: a target that imports it (a policy built on its ``BasePolicy``) does not make it the
project's code, even where its source sits in the project (a checkout): its version is recorded instead,
and a running process never executes its modules again."""


def _absolute(parts: list[str], beside: Path, root: Path) -> list[Path]:
    if parts[0] in sys.stdlib_module_names or parts[0] == OWN_PACKAGE:
        return []
    return _dotted(beside, parts) or _dotted(root, parts)


def _dotted(base: Path, parts: list[str]) -> list[Path]:
    """The files importing ``parts`` (``a.b.c``) from ``base`` runs: each package's ``__init__``, then the module.

    A name that is no module of the package before it (an attribute) ends the walk.
    """
    files: list[Path] = []
    here = base
    for part in parts:
        package, module = here / part, here / f"{part}.py"
        if (package / "__init__.py").is_file():
            files.append((package / "__init__.py").resolve())
            here = package
        elif module.is_file():
            files.append(module.resolve())
            break
        elif package.is_dir():  # a namespace package
            here = package
        else:
            break
    return files


def _installed(path: Path) -> bool:
    return not {"site-packages", "dist-packages"}.isdisjoint(path.parts)


_LOADED: dict[str, str] = {}
"""Module name -> the digest of its file as this process last executed it (for targets and their sources)."""


def _as_on_disk(files: list[Path]) -> None:
    """Execute a target's modules again if any of their files changed since they ran in this process.

    A Celery worker runs unit after unit in one process, so a policy file edited between two runs would
    otherwise keep running as first imported, while the result's provenance records the digest of the
    edited file (:mod:`hud_pipelines.eval.sources`). The files looked at are the ones digested there
    (:func:`target_sources`); when one changed, every one of them loaded here runs again, the target last,
    so each runs after the modules it imports. The source is compiled afresh, never from a bytecode
    cache (an edit within the same second keeps the file's size and mtime alike).
    """
    wanted = set(files)
    names = {file.name for file in files}
    loaded: dict[Path, ModuleType] = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.basename(file) in names and (path := Path(file).resolve()) in wanted:
            loaded[path] = module
    digests = {path: code_digest(path) for path in loaded}
    changed = [path for path in loaded if _LOADED.setdefault(loaded[path].__name__, digests[path]) != digests[path]]
    if not changed:
        return
    log.info("%s changed since this process imported it: its modules run again", ", ".join(map(str, changed)))
    for path in reversed([file for file in files if file in loaded]):
        module = loaded[path]
        exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)  # its own source, as its import ran it
        _LOADED[module.__name__] = digests[path]


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
    project = project_root(parts[0], base)  # where the import finds it (project_first), so its file is digested
    for root in (
        *([project] if project else []),
        *(Path(entry) for entry in sys.path),
        base,
        *base.parents,
        Path.cwd(),
    ):
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
