"""The shape of the product code: packages import one way (capo_train -> data_prep -> capo_envs), no module
imports itself through others (function-level imports included), and no product file outgrows one job."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("capo_envs", "data_prep", "capo_train")  # lower first: each may import only those before it
MAX_LINES = 500


def product_files() -> dict[str, Path]:
    """Module name -> file, for every .py file of the three packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The product modules ``name`` imports anywhere in its file (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the submodule sub when there is one
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    known = product_files()
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_packages_import_one_way():
    upward = []
    for name, targets in import_graph().items():
        level = PACKAGES.index(name.partition(".")[0])
        for target in targets:
            if PACKAGES.index(target.partition(".")[0]) > level:
                upward.append(f"{name} -> {target}")
    assert upward == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_product_file_is_over_500_lines(package):
    long = {str(path.relative_to(ROOT)): n for path in (ROOT / package).rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_every_repository_path_named_in_product_code_and_docs_exists():
    """A comment or doc that names ``tests/...``, ``docs/...`` or ``benchmarks/...`` must name a real file."""
    import re

    pattern = re.compile(r"(?<![\w/.])((?:tests|docs|benchmarks|scripts)/[\w./-]*\w\.(?:py|md|sh|png|jsonl|yaml))")
    sources = [*(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")),
               *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    missing = sorted({f"{path.relative_to(ROOT)}: {ref}" for path in sources
                      for ref in pattern.findall(path.read_text(encoding="utf-8"))
                      if not (ROOT / ref).exists()})
    assert missing == []


def test_no_reference_points_outside_the_repository():
    """Users get the repository: no notes outside it are cited from product code or docs."""
    sources = [*(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")),
               *(ROOT / "docs").rglob("*.md"), ROOT / "README.md", *(ROOT / "benchmarks").glob("*.py")]
    outside = sorted(f"{path.relative_to(ROOT)}:{number}" for path in sources
                     for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                     if "shared/docs" in line or "capo-spec" in line or "domain doc" in line)
    assert outside == []
