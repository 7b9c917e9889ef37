"""Imports run one way (docs/developers.md): no module of the package imports one that imports it back, however
indirectly; the lab bench is imported by no training code; the run loop by nothing but the command line."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in [*(ROOT / "cory").rglob("*.py"), *(ROOT / "lab").rglob("*.py")]:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            # "from cory import models" names the module; the package itself only re-exports
            graph[name] |= {t for t in targets if t in modules and t not in (name, "cory", "cory.device", "cory.run", "cory.tasks", "lab")}
    return graph


def test_no_module_imports_one_that_imports_it_back():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join(path + [nxt])
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_lab_and_the_run_loop_are_imported_from_above_only():
    graph = _graph()
    assert any(name.startswith("lab.") for name in graph)
    assert not (ROOT / "cory" / "lab").exists()  # the lab left cory/ whole: no pointer files stay behind
    for name, targets in graph.items():
        if not name.startswith("lab"):
            assert not {t for t in targets if t.startswith("lab")}, f"{name} imports the lab bench"
        if name not in ("cory.cli",) and not name.startswith("lab"):
            assert "cory.train" not in targets and "cory.cli" not in targets, f"{name} imports the run loop"
    assert "cory.train" not in graph["cory.run.checkpoint"]


def test_the_lab_names_each_of_its_modules():
    """lab/__init__.py is the lab's table of contents: each module of lab/ has its line there."""
    import lab

    listed = {line.split()[0] for line in lab.__doc__.splitlines()[2:] if line.strip()}
    assert listed == {p.stem for p in (ROOT / "lab").glob("*.py") if p.stem != "__init__"}
