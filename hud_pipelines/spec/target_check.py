"""Check that a ``module:attribute`` or ``path/to/file.py:attribute`` import path names something.

Policy and grader targets often live in modules that import torch (5 s) or lerobot (11 s) at the
top. Validation should not pay that: the module is *found* (``importlib.util.find_spec``, which
runs only parent packages' ``__init__``) and its source is read with :mod:`ast` for top-level
definitions. Only a module whose names cannot be known statically (a C extension, a module-level
``__getattr__``, a star import) is imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

from hud_pipelines.spec.problems import did_you_mean
from hud_pipelines.targets import not_callable, project_first, project_root, shadowed_sibling

_BLOCKS = (ast.If, ast.Try, ast.TryStar, ast.With, ast.For, ast.While)


def target_problem(target: str, base_dir: Path | None = None, *, run_code: bool = True) -> str | None:
    """Why ``target`` cannot be imported, or ``None`` when it names an existing attribute.

    A ``file.py`` part must already be absolute (see ``PipelineSpec.resolve_target``). A module is looked
    for as a run imports it (:func:`~hud_pipelines.targets.project_first`, from ``base_dir``: the YAML's
    folder; default the working directory), so validation says what the run will meet. ``run_code=False``
    never imports the module itself: one whose names cannot be read from its source passes.
    """
    module_part, sep, attribute = target.rpartition(":")
    if not sep or not module_part or not attribute.isidentifier():
        return f"expected 'module:attribute' or 'path/to/file.py:attribute', got {target!r}"
    if module_part.endswith(".py"):
        return _file_problem(Path(module_part), attribute, run_code)
    return _module_problem(module_part, attribute, (base_dir or Path.cwd()).resolve(), run_code)


def missing_file_problem(path: Path) -> str | None:
    """``file ... does not exist`` with the closest file beside it, or ``None`` when ``path`` is a file."""
    if path.is_file():
        return None
    siblings = [p.name for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
    return f"file {path} does not exist{did_you_mean(path.name, siblings)}"


def _file_problem(path: Path, attribute: str, run_code: bool) -> str | None:
    missing = missing_file_problem(path)
    if missing is not None:
        return missing
    shadowed = shadowed_sibling(path)
    if shadowed is not None:
        return shadowed
    names = _static_names(path)
    if isinstance(names, str):
        return names
    if names is None and not run_code:
        return None
    if names is None:
        spec = importlib.util.spec_from_file_location(f"_hud_target_{path.stem}", path)
        if spec is None or spec.loader is None:
            return f"cannot load {path} as a Python module"
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            return f"importing {path} raised {type(exc).__name__}: {exc}"
        names = _runtime_names(module, attribute)
    return _attribute_problem(str(path), attribute, names)


def _module_problem(module_name: str, attribute: str, base: Path, run_code: bool) -> str | None:
    clash = project_first(module_name, base)
    if clash is not None:
        return f"cannot import module {module_name!r}: {clash}"
    try:
        spec = _find_spec(module_name, run_code)
    except _Unseen:
        return None
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        leaf = missing.rpartition(".")[2]
        hint = did_you_mean(leaf, exc.beside) if isinstance(exc, _NotThere) else _module_hint(missing)
        hint += _passed_over(module_name, base)
        return f"cannot import module {module_name!r}: no module named {missing!r}{hint}"
    except Exception as exc:  # a parent package's __init__ failed, or the name is not a module name
        return f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
    if spec is None:
        hint = _module_hint(module_name) + _passed_over(module_name, base)
        return f"cannot import module {module_name!r}: no module of that name{hint}"
    names: dict[str, str | None] | str | None = None
    if spec.origin and spec.origin.endswith(".py") and Path(spec.origin).is_file():
        names = _static_names(Path(spec.origin))
        if isinstance(names, str):
            return names
    if names is None and not run_code:
        return None
    if names is None:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            return f"importing {module_name!r} raised {type(exc).__name__}: {exc}"
        names = _runtime_names(module, attribute)
    return _attribute_problem(module_name, attribute, names)


def _passed_over(module_name: str, base: Path) -> str:
    """Why the project's folder of ``module_name``'s top-level name was not the package imported, if it was not:
    a folder without ``__init__.py`` is a namespace portion, and a regular package of that name anywhere on
    ``sys.path`` (an editable install's checkout, an installed package) wins over it."""
    top = module_name.split(".", 1)[0]
    root = project_root(top, base)
    folder = None if root is None else root / top
    if folder is None or not folder.is_dir() or (folder / "__init__.py").is_file():
        return ""
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return ""
    if found is None or not found.has_location or not found.origin:
        return ""
    return (
        f"; {top!r} is {found.origin}, not the project's {folder}, which has no __init__.py: a package of that "
        f"name elsewhere wins over such a folder (add {folder / '__init__.py'}, or rename the folder)"
    )


class _Unseen(Exception):
    """A module that only running a parent package could find (it may extend its ``__path__`` when it runs)."""


def _find_spec(module_name: str, run_code: bool) -> ModuleSpec | None:
    """``importlib.util.find_spec(module_name)``, which imports the parent packages (runs their ``__init__``).

    Without ``run_code`` a parent not imported yet is not run: each level is asked of the import system's
    finders (``sys.meta_path``) with its parent's search locations, as an import would ask them. A level that
    nothing finds raises :class:`_NotThere` (a ``ModuleNotFoundError``, as ``find_spec`` raises), unless its
    parent's ``__init__`` touches ``__path__`` (it may add locations when it runs): :class:`_Unseen`, left to
    the run.
    """
    parent = module_name.rpartition(".")[0]
    if run_code or not parent or parent in sys.modules:
        return importlib.util.find_spec(module_name)
    found: ModuleSpec | None = None
    name = ""
    for part in module_name.split("."):
        if found is not None and found.submodule_search_locations is None:
            raise _NotThere(f"{name}.{part}", [])  # a module, not a package: nothing is below it
        above, locations = found, None if found is None else list[str](found.submodule_search_locations or ())
        name = f"{name}.{part}" if name else part
        found = next((spec for finder in sys.meta_path if (spec := _ask(finder, name, locations)) is not None), None)
        if found is None and above is not None and above.origin and "__path__" in _text(above.origin):
            raise _Unseen(name)
        if found is None:
            raise _NotThere(name, [module.name for module in pkgutil.iter_modules(locations)])
    return found


class _NotThere(ModuleNotFoundError):
    """A level of a module path that no finder has, with the names beside it (its parent's folders')."""

    def __init__(self, name: str, beside: list[str]) -> None:
        super().__init__(f"no module named {name!r}", name=name)
        self.beside = beside


def _text(origin: str) -> str:
    """A module's source, or nothing where it has none to read."""
    try:
        return Path(origin).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _ask(finder: object, name: str, locations: list[str] | None) -> ModuleSpec | None:
    """One meta path finder's spec of ``name`` (``None``: it has none, or is of the old protocol)."""
    find = getattr(finder, "find_spec", None)
    if find is None:
        return None
    try:
        spec: object = find(name, locations)
    except (ImportError, ValueError, TypeError):
        return None
    return spec if isinstance(spec, ModuleSpec) else None


def target_parameters(target: str, *, run_code: bool = True) -> frozenset[str] | None:
    """The keyword arguments ``target`` takes, read from its source; ``None`` when that cannot be known.

    A top-level function, or a class whose own body defines ``__init__``, says its parameters; ``*args``,
    ``**kwargs``, decorators, inherited constructors and modules without Python source leave them open.
    ``run_code=False``: the module is found without importing a parent package (:func:`_find_spec`).
    """
    module_part, _, attribute = target.rpartition(":")
    if module_part.endswith(".py"):
        source: Path | None = Path(module_part)
    else:
        try:
            spec = _find_spec(module_part, run_code)
        except Exception:
            return None
        source = Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None
    if source is None or not source.is_file():
        return None
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (SyntaxError, OSError, UnicodeDecodeError, ValueError):
        return None
    found = [node for node in tree.body if getattr(node, "name", None) == attribute]
    if any(
        attribute in _bound(target) for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
    ):
        return None  # rebound at module level (``make = wrap(make)``): the def is not what is called
    definition = found[-1] if found else None
    if isinstance(definition, ast.ClassDef) and not definition.decorator_list:
        inits = [n for n in definition.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        return _parameters(inits[-1].args, skip_first=True) if inits else None
    if isinstance(definition, ast.FunctionDef) and not definition.decorator_list:
        return _parameters(definition.args, skip_first=False)
    return None


def _parameters(arguments: ast.arguments, *, skip_first: bool) -> frozenset[str] | None:
    if arguments.vararg is not None or arguments.kwarg is not None:
        return None
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)][1 if skip_first else 0 :]
    keywords = positional[len(arguments.posonlyargs) - (1 if skip_first and arguments.posonlyargs else 0) :]
    return frozenset([*keywords, *(a.arg for a in arguments.kwonlyargs)])  # args are passed by keyword


def _runtime_names(module: object, attribute: str) -> dict[str, str | None]:
    """Names of an imported module, each with what it is where it cannot be called (:func:`not_callable`);
    ``hasattr`` also sees what a module-level ``__getattr__`` provides, which is never run for the others."""
    names = {name: not_callable(value) for name, value in vars(module).items()}
    names |= {name: None for name in dir(module) if name not in names}
    if attribute not in names and hasattr(module, attribute):
        names[attribute] = not_callable(getattr(module, attribute))
    return names


def _attribute_problem(owner: str, attribute: str, names: dict[str, str | None]) -> str | None:
    """A missing attribute, with the closest name that can be called; or one that is a module or a constant: a
    target is called (a factory, a class, a function), or is a policy object with ``infer``."""
    callables = sorted(n for n, what in names.items() if what is None and not n.startswith("_"))
    if attribute not in names:
        return f"{owner} has no attribute {attribute!r}{did_you_mean(attribute, callables)}"
    what = names[attribute]
    if what is None:
        return None
    hint = did_you_mean(attribute, callables)
    return f"{owner}: {attribute!r} is {what}, not a function, a class or a policy object{hint}"


def _module_hint(module_name: str) -> str:
    parent, _, leaf = module_name.rpartition(".")
    try:
        if parent:
            package = importlib.import_module(parent)
            search = list(getattr(package, "__path__", []))
            siblings = [m.name for m in pkgutil.iter_modules(search)]
        else:
            siblings = [m.name for m in pkgutil.iter_modules()]
    except Exception:
        return ""
    return did_you_mean(leaf, siblings)


def _static_names(path: Path) -> dict[str, str | None] | str | None:
    """Top-level names bound by a module's source, each with what it is where its every binding is an import of a
    module or a literal (``"a module"``, ``"a value of type int"``), else ``None``; ``None`` when the names cannot be
    known without running it.

    A string is a problem (the file does not parse).
    """
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}: syntax error: {exc.msg}"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot read {path}: {exc}"
    names: dict[str, str | None] = {}
    if not _collect(tree.body, names):
        return None
    return names


def _collect(statements: list[ast.stmt], names: dict[str, str | None]) -> bool:
    """Add the names ``statements`` bind (:func:`_static_names`); ``False`` when a star import or ``__getattr__``
    makes them open-ended."""

    def bind(name: str, what: str | None) -> None:  # one binding that may be called makes the name one
        names[name] = what if names.get(name, what) is not None else None

    for statement in statements:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if statement.name == "__getattr__":
                return False
            bind(statement.name, None)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                constant = _constant(statement.value) if isinstance(target, ast.Name) else None
                for name in _bound(target):
                    bind(name, constant)
        elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
            for name in _bound(statement.target):
                bind(name, None)
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                bind(alias.asname or alias.name.split(".")[0], "a module")
        elif isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if alias.name == "*":
                    return False
                bind(alias.asname or alias.name, None)
        elif isinstance(statement, _BLOCKS):
            for block in _blocks(statement):
                if not _collect(block, names):
                    return False
    return True


def _blocks(statement: ast.stmt) -> list[list[ast.stmt]]:
    blocks: list[list[ast.stmt]] = []
    for attribute in ("body", "orelse", "finalbody"):
        block: object = getattr(statement, attribute, None)
        if isinstance(block, list):
            blocks.append([s for s in block if isinstance(s, ast.stmt)])  # pyright: ignore[reportUnknownVariableType]
    for handler in getattr(statement, "handlers", []):
        if isinstance(handler, ast.ExceptHandler):
            blocks.append(handler.body)
    return blocks


def _constant(value: ast.expr) -> str | None:
    """What a module-level value is when it is a literal, which nothing can call (``"a value of type int"``)."""
    if isinstance(value, ast.Constant):
        return f"a value of type {type(value.value).__name__}"
    literal: dict[type[ast.expr], str] = {
        ast.List: "list",
        ast.Tuple: "tuple",
        ast.Dict: "dict",
        ast.Set: "set",
        ast.JoinedStr: "str",
    }
    kind = literal.get(type(value))
    return None if kind is None else f"a value of type {kind}"


def _bound(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Tuple | ast.List):
        return {name for element in target.elts for name in _bound(element)}
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    return set()
