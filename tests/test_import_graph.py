"""pdraft's package-level import graph has no cycle. Every module is parsed with `ast` (imports inside functions
included: a function-level import that only dodges a cycle is still a cycle); a node is the first sub-package
under pdraft (pdraft.decode, pdraft.bench, ...) or a top-level module (pdraft.recipe), and an edge A -> B means
some module of A imports something of B."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pdraft"


def node_of(module: str) -> str | None:
    """pdraft.decode.engine -> pdraft.decode; pdraft.recipe -> pdraft.recipe; pdraft -> None (the root)."""
    parts = module.split(".")
    if parts[0] != "pdraft" or len(parts) == 1:
        return None
    return ".".join(parts[:2])


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """Every pdraft module or attribute path that `path` imports, wherever the import statement stands."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
            else:
                target = n.module or ""
            out |= {target} | {f"{target}.{a.name}" for a in n.names if is_module(f"{target}.{a.name}")}
    return {m for m in out if m == "pdraft" or m.startswith("pdraft.")}


def is_module(name: str) -> bool:
    """pdraft.cache.format names a module; pdraft.__version__ or pdraft.cache.HiddenCache do not."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def graph() -> dict[str, dict[str, list[str]]]:
    """node -> {imported node: [the modules of node that import it]}."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        src = node_of(module_name(path))
        if src is None:
            continue
        for target in imported(path):
            dst = node_of(target)
            if dst is not None and dst != src:
                edges.setdefault(src, {}).setdefault(dst, []).append(module_name(path))
    return edges


def find_cycle(edges: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, {})):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_checker_finds_a_cycle():
    edges = {"pdraft.a": {"pdraft.b": ["pdraft.a.x"]}, "pdraft.b": {"pdraft.c": ["pdraft.b.y"]},
             "pdraft.c": {"pdraft.a": ["pdraft.c.z"]}}
    assert find_cycle(edges) == ["pdraft.a", "pdraft.b", "pdraft.c", "pdraft.a"]
    del edges["pdraft.c"]
    assert find_cycle(edges) is None


def test_function_level_and_relative_imports_count(tmp_path):
    assert node_of("pdraft.decode.engine") == "pdraft.decode" and node_of("pdraft.recipe") == "pdraft.recipe"
    edges = graph()
    assert edges and all(src.startswith("pdraft.") for src in edges)


def test_no_package_cycle():
    edges = graph()
    cycle = find_cycle(edges)
    if cycle:
        hops = [f"{a} -> {b} (imported by {', '.join(sorted(set(edges[a][b])))})" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("package import cycle:\n  " + "\n  ".join(hops))
