"""pdraft's import graph has no cycle, at two grains: packages (a node is the first sub-package under pdraft,
pdraft.decode, pdraft.bench, ..., or a top-level module such as pdraft.recipe; an edge A -> B means some module
of A imports something of B) and modules (a node is one module, a package's __init__ included). Every module is
parsed with `ast`, so imports inside functions and under `if TYPE_CHECKING:` count too: a function-level import
that only dodges a cycle is still a cycle, and so is an annotation-only one. Registries name the implementations
they import on first use ("pdraft.models.dspark.model:DSparkDrafter", pdraft.lazy); those names are not imports
and are checked here another way: each names an object that exists, and reading the registries imports no
torch."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pdraft"


def node_of(module: str) -> str | None:
    """pdraft.decode.engine -> pdraft.decode; pdraft.recipe -> pdraft.recipe; pdraft -> None (the root)."""
    parts = module.split(".")
    if parts[0] != "pdraft" or len(parts) == 1:
        return None
    return ".".join(parts[:2])


def module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, package: Path = PACKAGE) -> set[str]:
    """Every pdraft module or attribute path that `path` imports, wherever the import statement stands."""
    mod = module_name(path, package)
    parent = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = parent.split(".")[: len(parent.split(".")) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
            else:
                target = n.module or ""
            subs = {f"{target}.{a.name}" for a in n.names if is_module(f"{target}.{a.name}", package)}
            # `from pkg import submodule` depends on the submodule, not on what pkg/__init__.py defines
            out |= subs | ({target} if len(subs) < len(n.names) else set())
    return {m for m in out if m == "pdraft" or m.startswith("pdraft.")}


def is_module(name: str, package: Path = PACKAGE) -> bool:
    """pdraft.cache.format names a module; pdraft.__version__ or pdraft.cache.HiddenCache do not."""
    path = package.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def graph(package: Path = PACKAGE) -> dict[str, dict[str, list[str]]]:
    """node -> {imported node: [the modules of node that import it]}."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(package.rglob("*.py")):
        src = node_of(module_name(path, package))
        if src is None:
            continue
        for target in imported(path, package):
            dst = node_of(target)
            if dst is not None and dst != src:
                edges.setdefault(src, {}).setdefault(dst, []).append(module_name(path, package))
    return edges


def module_graph(package: Path = PACKAGE) -> dict[str, dict[str, list[str]]]:
    """module -> {imported module: [itself]}: an import of a name from a module is an edge to that module (an
    attribute path is cut back to the module that holds it)."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(package.rglob("*.py")):
        src = module_name(path, package)
        for target in imported(path, package):
            while not is_module(target, package):
                target = target.rpartition(".")[0]
            if target and target != src:
                edges.setdefault(src, {}).setdefault(target, []).append(src)
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


def _explain(edges, cycle) -> str:
    return "\n  ".join(f"{a} -> {b} (imported by {', '.join(sorted(set(edges[a][b])))})"
                       for a, b in zip(cycle, cycle[1:]))


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


def test_the_module_checker_sees_a_cycle_behind_type_checking(tmp_path):
    """The settings <-> scheduler loop that the package-level test could not see (both in pdraft.decode, one side
    an annotation-only import) is found at module level; the same two files without it are clean."""
    pkg = tmp_path / "pdraft"
    (pkg / "decode").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "decode" / "__init__.py").write_text("")
    (pkg / "decode" / "settings.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pdraft.decode.scheduler import SpsTable\n")
    (pkg / "decode" / "scheduler.py").write_text("from pdraft.decode.settings import VerifyConfig\n")
    assert find_cycle(graph(pkg)) is None  # one package: invisible at that grain
    assert find_cycle(module_graph(pkg)) == ["pdraft.decode.scheduler", "pdraft.decode.settings",
                                             "pdraft.decode.scheduler"]
    (pkg / "decode" / "settings.py").write_text("X = 1\n")
    assert find_cycle(module_graph(pkg)) is None


def test_no_package_cycle():
    edges = graph()
    cycle = find_cycle(edges)
    if cycle:
        raise AssertionError("package import cycle:\n  " + _explain(edges, cycle))


def test_no_module_cycle():
    edges = module_graph()
    assert len(edges) > 50  # every module is read
    cycle = find_cycle(edges)
    if cycle:
        raise AssertionError("module import cycle:\n  " + _explain(edges, cycle))


def test_registry_names_resolve_and_registries_read_without_torch():
    """Every "module:attr" a registry names imports and exists (the family specs' models, the policies'
    classes, pdraft.models' lazy names), and the registries, the recipe and its explanation import no torch."""
    code = ("import sys; import pdraft.recipe, pdraft.models.families, pdraft.policies; pdraft.recipe.explain(); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)
    import pdraft.models
    from pdraft.lazy import load
    from pdraft.models.families import FAMILIES
    from pdraft.policies import POLICIES
    from pdraft.policies.base import VerifyPolicy

    for spec in FAMILIES:
        assert spec.model_class().__name__ == spec.model.rpartition(":")[2]
        assert spec.config.kind == spec.kind
    for spec in POLICIES:
        assert issubclass(spec.policy_class(), VerifyPolicy)
    for name in pdraft.models.__all__:
        assert getattr(pdraft.models, name) is load(pdraft.models._WHERE[name])


def test_training_data_does_not_climb_into_decoding_or_sharing():
    """Training, the hidden-state cache and data preparation import nothing of the decoder or of the Hub code
    (issue 43: online training pulled sequence preparation from export-hidden, whose regeneration reached into
    pdraft.decode, and drafter.init_from into pdraft.hub): the commands hand in pdraft's own loop
    (pdraft.decode.session.target_alone_loop) and resolve drafter.init_from to a folder before training."""
    edges = graph()
    for low in ("pdraft.train", "pdraft.cache", "pdraft.data"):
        for high in ("pdraft.decode", "pdraft.hub", "pdraft.bench", "pdraft.calibrate"):
            assert high not in edges.get(low, {}), f"{low} imports {high} ({edges[low][high]})"


def layers(edges: dict[str, dict[str, list[str]]]) -> dict[str, int]:
    """Each package's layer: 1 for one that imports no other package, else one above the highest it imports
    (the graph has no cycle: test_no_package_cycle)."""
    out: dict[str, int] = {}

    def layer(n: str) -> int:
        if n not in out:
            out[n] = 1 + max((layer(m) for m in edges.get(n, {})), default=0)
        return out[n]

    for n in list(edges) + [m for targets in edges.values() for m in targets]:
        layer(n)
    return out


def test_the_packages_stand_on_at_most_14_layers():
    """A chain of imports from `python -m pdraft` down to pdraft.errors is at most 14 packages long (issue 43: it
    was 16, with the runtime above the recipe and the Hub code above the bench): each layer is one more place a
    reader has to hold in mind. The checker counts a known chain right."""
    assert layers({"pdraft.a": {"pdraft.b": []}, "pdraft.b": {"pdraft.c": []}, "pdraft.x": {"pdraft.c": []}}) == \
        {"pdraft.a": 3, "pdraft.b": 2, "pdraft.c": 1, "pdraft.x": 2}
    found = layers(graph())
    top = max(found.values())
    chain = sorted(found, key=found.get, reverse=True)
    assert top <= 14, f"{top} layers: {', '.join(f'{n} {found[n]}' for n in chain[:top])}"
