"""The package's import graph: no cycles, and no import from a lower room into a higher one.

Rooms, lowest first (a module may import its own room and any lower one):
errors/units/version/settings/notices < format < backends < model, text < runtime, vision < engine < cluster < tools
< api < server, bench < cli. Inside ``backends``, each family is a folder of its own
(``backends/<family>/``: its modules and kernel files); only that folder and the family list
(``backends/families.py``) import its modules or name its kernel files. The graph is built with ``ast``
from every ``import`` statement, those inside functions included (a lazy import is still a
dependency), so a cycle cannot hide behind one.
"""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[1] / "cooktop"

RANK = {
    "errors": 0, "units": 0, "version": 0, "settings": 0, "notices": 0,
    "shaders": 1, "format": 1,
    "backends": 2,
    "model": 3, "text": 3,
    "runtime": 4,
    "vision": 4,  # mmproj files and the vision encoder: on format, backends and model; cli calls it
    "engine": 5,
    "cluster": 5.5,  # Ray: above engine (it builds Engines), below api/server/cli (which offer it)
    "tools": 6,
    "quantize": 6,  # reads format, written to by cli only
    "api": 7,
    "server": 8, "bench": 8, "quality": 8,
    "cli": 9,
    "report": 9,  # `cooktop report` composes the commands' own reports (devices, plan) with bench and quality
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """``{module: {cooktop modules it imports}}`` for every module of the package."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[:len(base) - node.level + 1]
                    mod = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # `from pkg import sub` may name a submodule
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t.startswith("cooktop") and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def room(module: str) -> str:
    """``cooktop.model.config`` -> ``model``; the root package -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_room_has_a_rank():
    rooms = {room(m) for m in import_graph()} - {"", "__main__"}
    assert rooms <= set(RANK), f"rooms without a rank in this test: {sorted(rooms - set(RANK))}"


def test_no_upward_imports():
    bad = []
    for mod, deps in import_graph().items():
        r = room(mod)
        if r in ("", "__main__"):  # the root package re-exports the public API; __main__ runs the CLI
            continue
        for d in deps:
            if room(d) == "":
                bad.append(f"{mod} imports the root package {d}")
            elif RANK[room(d)] > RANK[r]:
                bad.append(f"{mod} ({r}) imports {d} ({room(d)})")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_graph_sees_lazy_and_relative_imports():
    """The checker itself: it resolves relative and function-level imports (else it could pass vacuously)."""
    g = import_graph()
    assert "cooktop.format.gguf" in g["cooktop.model.config"]
    assert "cooktop.backends.registry" in g["cooktop.runtime.loader"]
    assert "cooktop.cli.group" in g["cooktop.cli.run"]
    assert len(g) > 40


BACKENDS = PKG / "backends"


def family_folders() -> list[pathlib.Path]:
    """``backends/<family>/`` packages: folders whose ``__init__.py`` defines ``FAMILY``."""
    return sorted(p.parent for p in BACKENDS.glob("*/__init__.py") if "FAMILY = " in p.read_text())


def test_families_are_folders():
    """The family list names exactly the family folders, each describing itself."""
    from cooktop.backends.families import FAMILIES

    assert sorted(f.name for f in family_folders()) == sorted(FAMILIES)
    for name, fam in FAMILIES.items():
        assert fam.backend.startswith(f"cooktop.backends.{name}."), fam.backend
    assert not list(BACKENDS.glob("*.cl")) and not (PKG / "shaders").exists()


def test_only_a_family_imports_its_modules():
    """Nothing outside ``backends/<family>/`` (and the family list) imports a family's modules."""
    allowed = {"cooktop.backends.families"}
    bad = []
    for folder in family_folders():
        fam = f"cooktop.backends.{folder.name}"
        for mod, deps in import_graph().items():
            if mod == fam or mod.startswith(fam + ".") or mod in allowed:
                continue
            bad += [f"{mod} imports {d}" for d in deps if d == fam or d.startswith(fam + ".")]
    assert not bad, "imports of a family's modules from outside its folder:\n" + "\n".join(sorted(bad))


def test_only_a_family_names_its_kernel_files():
    """No module outside ``backends/<family>/`` names one of its kernel files (``.cl``, ``.comp``,
    ``.glsl``, ``.spv``, the variant table): kernels are the family's own business."""
    bad, checked = [], 0
    for folder in family_folders():
        names = {p.name for p in folder.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")}
        for path in PKG.rglob("*.py"):
            if folder in path.parents:
                continue
            text = path.read_text()
            bad += [f"{path.relative_to(PKG.parent)} names {folder.name}/{n}" for n in sorted(names) if n in text]
        checked += len(names)
    assert checked > 40  # the OpenCL kernels, the GLSL sources, the SPIR-V and the variant table
    assert not bad, "kernel files named outside their family's folder:\n" + "\n".join(sorted(bad))


def test_family_rule_sees_violations():
    """The checker itself: an import of a family module from another room is caught."""
    g = import_graph()
    assert "cooktop.backends.cpu" in g["cooktop.backends.families"]
    assert any(d.startswith("cooktop.backends.opencl.") for d in g["cooktop.backends.opencl.device"])
    assert len(family_folders()) >= 3


def test_no_issue_numbers_in_the_code():
    """Comments and docstrings say what and why, not which tracker entry asked for it: an issue
    number means nothing to a reader of the repository."""
    import re

    root = PKG.parent
    pattern = re.compile(r"\b[Ii]ssues? ?#?\d+|\(#\d+\)")
    files = [*PKG.rglob("*.py"), *PKG.rglob("*.cl"), *PKG.rglob("*.comp"), *PKG.rglob("*.glsl"),
             *(root / "scripts").rglob("*.py"), *(root / "scripts").rglob("*.sh"), root / "Makefile",
             root / ".ci" / "run"]
    bad = [f"{p.relative_to(root)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
           if pattern.search(line)]
    assert not bad, "issue numbers in the code: " + ", ".join(bad)
