"""The package's public surface: a module's `__all__` names what other layers and devtools may use of it.

Modules of one layer share more among themselves; what crosses a layer goes through `__all__`. Checked
from the source: every `__all__` names attributes the module has, and no module of another layer (or of
devtools) imports, or reads off an imported module, a name its `__all__` leaves out.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import hami_mt_webhook
from devtools.paths import REPO_ROOT


def package_modules() -> dict[str, ModuleType]:
    """Every module of the package, imported (not the `__main__` entry points: they run the CLI)."""
    names = [hami_mt_webhook.__name__] + [
        info.name for info in pkgutil.walk_packages(hami_mt_webhook.__path__, "hami_mt_webhook.")
        if not info.name.endswith(".__main__")]
    return {name: importlib.import_module(name) for name in names}


MODULES = package_modules()


def layer(module: str) -> str:
    """`service` for hami_mt_webhook.service.app, `devtools` for any devtools module, "" for the root."""
    parts = module.split(".")
    if parts[0] == "devtools":
        return "devtools"
    subpackage = MODULES.get(".".join(parts[:2])) if len(parts) > 1 else None
    return parts[1] if subpackage is not None and hasattr(subpackage, "__path__") else ""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def uses(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, package module, name) for each name the file imports from a package module or reads off one."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}  # local name -> the package module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
                elif target in MODULES:
                    yield node.lineno, target, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            target = bound[node.value.id]
            if f"{target}.{node.attr}" not in MODULES:
                yield node.lineno, target, node.attr


def crossings() -> Iterator[tuple[str, int, str, str]]:
    """(file, line, module, name) for each use of a package module from another layer or from devtools
    (module dunders such as `__file__` aside)."""
    for path in sorted([*(REPO_ROOT / "hami_mt_webhook").rglob("*.py"), *(REPO_ROOT / "devtools").rglob("*.py")]):
        me = module_name(path)
        for line, target, name in uses(path):
            if layer(target) != layer(me) and not (name.startswith("__") and name.endswith("__")):
                yield str(path.relative_to(REPO_ROOT)), line, target, name


def test_every_all_names_what_its_module_has() -> None:
    for name, module in MODULES.items():
        public = getattr(module, "__all__", None)
        if public is not None:
            assert len(set(public)) == len(public), f"{name}.__all__ repeats a name"
            assert [n for n in public if not hasattr(module, n)] == [], name


def test_other_layers_use_only_what_all_names() -> None:
    outside = [f"{file}:{line}: {name} is not in {target}.__all__" for file, line, target, name in crossings()
               if hasattr(MODULES[target], "__all__") and name not in MODULES[target].__all__]
    assert outside == []


def test_a_module_other_layers_use_has_an_all() -> None:
    without = {target for _, _, target, _ in crossings() if not hasattr(MODULES[target], "__all__")}
    assert without == set(), sorted(without)


#: Public names no other layer imports but that users do: documented interfaces.
DOCUMENTED = {"hami_mt_webhook": {"__version__"}}


def test_every_name_an_all_lists_is_used_by_another_layer_or_documented() -> None:
    """`__all__` is the surface other layers and devtools use, nothing more: a name only its own layer or the
    tests use stays off it (the tests may import it all the same)."""
    used: dict[str, set[str]] = {}
    for _, _, target, name in crossings():
        used.setdefault(target, set()).add(name)
    unused = {f"{module}.{name}" for module, m in MODULES.items() for name in getattr(m, "__all__", ())
              if name not in used.get(module, set()) | DOCUMENTED.get(module, set())}
    assert unused == set(), sorted(unused)
