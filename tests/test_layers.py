"""The house's structure, checked on the source with the standard library alone (`ast`, `tomllib`).

The contract is data at the top of this file: the layers of `src/engagelake/`, top to bottom,
the groups of a layer that never import each other, and the imports that are never made, each
with its reason. The checks read every module under `src/engagelake/` (each package's
`__init__` too) and count every import: at the top, inside functions (lazy), and under
`if TYPE_CHECKING:`. A failure lists every offending import, or every circle as a path.

- no import circle among the modules of `src/engagelake/`;
- a module imports only modules of its own layer or below, never a sibling it is independent
  of, never what `FORBIDDEN` names;
- no file under `src/` is over `MAX_LINES` lines;
- the per-folder ruff bans (`ruff.toml` beside the code) exist, so that CI's lint says the same.

The graph builder and each check are also tested on a made-up package (`tmp_path`) and made-up
graphs, where they must find what is there and nothing else: the checks on engagelake cannot
pass by finding nothing.
"""

from __future__ import annotations

import ast
import tomllib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "engagelake"
MAX_LINES = 800

# --- the contract ------------------------------------------------------------------------------
# A group is a top-level module or package of engagelake ("cli" is engagelake.cli and every
# module under it); "__init__" is engagelake's own __init__, the library's facade (`from
# engagelake import Workspace`). Top to bottom: a module may import its own group, the other
# groups of its layer (unless INDEPENDENT says otherwise) and the layers below, never above.
LAYERS: list[tuple[str, ...]] = [
    ("cli",),  # the Typer CLI: an edge, through Workspace and ingest
    ("api",),  # the REST server: an edge, through Workspace and the route table
    ("__init__", "ingest", "demo"),  # the facade; request files applied; the demo's workload
    ("workspace",),  # Workspace: open, apply (the one dispatch), call, read
    ("batch", "routes"),  # the batch engine; the route table (user endpoints and handlers)
    ("resources",),  # SCIM, preference centers, catalogs, campaigns: the handlers
    ("routing",),  # the router and the handler contract (Client, Context, Request, Response)
    ("rules", "store"),  # pure frame-in/frame-out rules; the Delta store: they meet in tables
    ("tables", "requests", "files", "permissions", "cpus", "connections", "errors", "version",
     "link_keys"),  # the shared vocabulary, leaves (link_keys: the key ring that signs recipients' links)
]
# groups of one layer that never import each other
INDEPENDENT: list[tuple[str, ...]] = [
    ("rules", "store"),  # docs/architecture.md: they meet in tables/, the row-source protocol
    ("batch", "routes"),  # the batch runs requests as routed; the route table names kinds only
]
# imports never made, whatever the layers say (the ruff.toml bans, and the architecture's rules)
_ENGINE_EDGES = {"api", "cli", "workspace", "batch", "resources"}
FORBIDDEN: dict[str, tuple[set[str], str]] = {
    "rules": ({"store"} | _ENGINE_EDGES, "rules/ are pure transforms: stored rows come through rules.state.State"),
    "store": ({"rules"} | _ENGINE_EDGES, "store/ knows tables/, never the rules nor who calls it"),
    "tables": ({"rules", "store"} | _ENGINE_EDGES, "tables/ is the neutral vocabulary of rules and store"),
    "resources": ({"workspace", "batch", "store"}, "resources/ use the routing.Client protocol and rules.state.State"),
    "api": ({"rules", "store"}, "the server dispatches through Workspace.apply"),
    "cli": ({"store"}, "the CLI applies and reads through Workspace"),
}
# folder -> the engagelake modules its ruff.toml bans (what CI's `ruff check` enforces)
RUFF_BANS: dict[str, set[str]] = {
    "src/engagelake/rules": {"engagelake.store"},
    "src/engagelake/store": {"engagelake.rules"},
    "src/engagelake/tables": {"engagelake.rules", "engagelake.store"},
    "src/engagelake/resources": {"engagelake.workspace", "engagelake.store"},
    "src/engagelake/api": {"engagelake.rules", "engagelake.store"},
    "src/engagelake/cli": {"engagelake.store"},
    "flows": {"engagelake.store"},
}


# --- the graph -----------------------------------------------------------------------------------
def module_files(package_dir: Path, package: str) -> dict[str, Path]:
    """Every module under `package_dir` by dotted name; a package's `__init__.py` is the package."""
    out: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of `body` and of the blocks within it (functions, classes, `if`, `try`,
    `with`, loops, `match`): where imports are, without walking every expression (8x faster)."""
    for stmt in body:
        yield stmt
        for block in ("body", "orelse", "finalbody"):
            yield from statements(getattr(stmt, block, None) or [])
        for part in (getattr(stmt, "handlers", None) or []) + (getattr(stmt, "cases", None) or []):
            yield from statements(part.body)


def import_graph(package_dir: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports, every import counted (top level, in functions,
    under `if TYPE_CHECKING:`). `from p import m` is an arrow to `p.m` when `p.m` is a module, else
    to `p` (its `__init__`); `import p.m` and `from p.m import x` to `p.m`; relative forms are
    resolved. Imports of other packages, and of modules that do not exist, are left out."""
    modules = module_files(package_dir, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in statements(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.append(sub if sub in modules else module)
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The circles of `graph`, as paths that end where they start: for each strongly connected
    component, the shortest circle through each of its modules (each circle once)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(start: str) -> None:  # Tarjan's, iteratively
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            connect(node)

    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for component in sorted(components, key=min):
        if len(component) == 1 and next(iter(component)) not in graph.get(next(iter(component)), ()):
            continue
        for start in sorted(component):
            parent: dict[str, str] = {}
            queue = deque([start])
            found = None
            while queue and found is None:
                node = queue.popleft()
                for child in sorted(graph.get(node, ())):
                    if child == start:
                        found = node
                        break
                    if child in component and child not in parent:
                        parent[child] = node
                        queue.append(child)
            assert found is not None
            path = [found]
            while path[-1] != start:
                path.append(parent[path[-1]])
            path.reverse()
            key = min(tuple(path[i:] + path[:i]) for i in range(len(path)))  # from its least module
            if key not in seen:
                seen.add(key)
                cycles.append([*key, key[0]])
    return cycles


def group_of(module: str, package: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == package else "__init__"


def layer_violations(graph: Mapping[str, set[str]], package: str, layers: Sequence[tuple[str, ...]],
                     independent: Sequence[tuple[str, ...]],
                     forbidden: Mapping[str, tuple[set[str], str]]) -> list[str]:
    """Every import `graph` makes against the contract, one readable line each."""
    layer = {group: i for i, groups in enumerate(layers) for group in groups}
    apart = {(a, b) for groups in independent for a in groups for b in groups if a != b}
    out = [f"{m}: its group '{group_of(m, package)}' is in no layer (add it to LAYERS)"
           for m in sorted(graph) if group_of(m, package) not in layer]
    for source in sorted(graph):
        here = group_of(source, package)
        for target in sorted(graph[source]):
            there = group_of(target, package)
            if here == there or here not in layer or there not in layer:
                continue
            if there in forbidden.get(here, (set(), ""))[0]:
                out.append(f"{source} -> {target}: {here} never imports {there} ({forbidden[here][1]})")
            elif layer[there] < layer[here]:
                out.append(f"{source} -> {target}: {here} (layer {layer[here] + 1}) imports {there}, "
                           f"a layer above it ({layer[there] + 1})")
            elif (here, there) in apart:
                out.append(f"{source} -> {target}: {here} and {there} never import each other")
    return out


def long_files(root: Path, max_lines: int) -> list[str]:
    """Text files under `root` (caches left out) over `max_lines` lines, longest first."""
    out: list[tuple[int, str]] = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if not path.is_file() or any(p == "__pycache__" or p.startswith(".") for p in rel.parts[:-1]):
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        lines = len(data.splitlines())
        if lines > max_lines:
            out.append((lines, str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)))
    return [f"{name}: {lines:,} lines (at most {max_lines})" for lines, name in sorted(out, reverse=True)]


@cache
def engagelake_graph() -> dict[str, set[str]]:
    return import_graph(SRC / PACKAGE, PACKAGE)


def report(title: str, lines: list[str]) -> str:
    return f"{title} ({len(lines)}):\n  " + "\n  ".join(lines)


# --- the checks on a made-up package ------------------------------------------------------------
@pytest.fixture
def made_up(tmp_path: Path) -> Path:
    """pkg/: `a` and `b` in a circle through a lazy import and a TYPE_CHECKING one; `sub` with
    every form of import."""
    files = {
        "__init__.py": "from pkg import b\n",
        "a.py": "import os\nfrom pkg.sub import c\n\ndef f():\n    from . import b\n    return b, c, os\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n",
        "sub/__init__.py": "from .c import Y\n",
        "sub/c.py": "import pkg.sub.d\nfrom pkg.sub import d, NAME\nfrom ..b import x\nY = 1\n",
        "sub/d.py": "import pkg\nfrom pkg import sub\nfrom .missing import z\n",
    }
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pkg"


def test_graph_counts_every_import(made_up: Path) -> None:
    assert import_graph(made_up, "pkg") == {
        "pkg": {"pkg.b"},
        "pkg.a": {"pkg.sub.c", "pkg.b"},  # top level, and lazy (a relative `from . import b`)
        "pkg.b": {"pkg.a"},  # under TYPE_CHECKING
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.sub.d", "pkg.sub", "pkg.b"},  # a module, a package's name, `..b`
        "pkg.sub.d": {"pkg", "pkg.sub"},  # packages are their __init__; a missing module is left out
    }


def test_statements_reach_every_import() -> None:
    code = """
import a
class C:
    import b
    def f(self):
        if x:
            import c
        elif y:
            import d
        else:
            with e:
                import e
for i in j:
    import f
else:
    import g
while k:
    import h
try:
    import i
except* E:
    import j
else:
    import k
finally:
    import l
async def g():
    async with m:
        import m
    async for n in o:
        import n
match p:
    case 1:
        import o
"""
    tree = ast.parse(code)
    found = [n.names[0].name for n in statements(tree.body) if isinstance(n, ast.Import)]
    assert sorted(found) == list("abcdefghijklmno")
    assert len(found) == sum(isinstance(n, ast.Import) for n in ast.walk(tree))


def test_cycles_and_layers_on_a_made_up_package(made_up: Path) -> None:
    assert find_cycles(import_graph(made_up, "pkg")) == [
        ["pkg", "pkg.b", "pkg.a", "pkg.sub.c", "pkg.sub.d", "pkg"],
        ["pkg.a", "pkg.b", "pkg.a"],  # through the lazy import and the TYPE_CHECKING one
        ["pkg.sub", "pkg.sub.c", "pkg.sub"],
        ["pkg.sub", "pkg.sub.c", "pkg.sub.d", "pkg.sub"],
    ]
    assert find_cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []
    assert find_cycles({"x": {"x"}}) == [["x", "x"]]
    assert find_cycles({"x": {"y"}, "y": {"x", "z"}, "z": {"y"}}) == [["x", "y", "x"], ["y", "z", "y"]]

    layered = {"pkg": {"pkg.top"}, "pkg.top": {"pkg.left", "pkg.right"}, "pkg.left": {"pkg.base"},
               "pkg.right": {"pkg.base"}, "pkg.base": set()}
    layers = [("__init__",), ("top",), ("left", "right"), ("base",)]
    apart = [("left", "right")]
    never = {"top": ({"base"}, "why")}
    assert layer_violations(layered, "pkg", layers, apart, never) == []
    against = {**layered, "pkg.top": {"pkg.left", "pkg.base"}, "pkg.left": {"pkg.right"},
               "pkg.base": {"pkg.top"}, "pkg.extra": set()}
    assert layer_violations(against, "pkg", layers, apart, never) == [
        "pkg.extra: its group 'extra' is in no layer (add it to LAYERS)",
        "pkg.base -> pkg.top: base (layer 4) imports top, a layer above it (2)",
        "pkg.left -> pkg.right: left and right never import each other",
        "pkg.top -> pkg.base: top never imports base (why)",
    ]


def test_long_files_on_made_up_files(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n" * 801)
    (tmp_path / "b.py").write_text("x = 1\n" * 800)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text("x = 1\n" * 900)
    (tmp_path / "d.bin").write_bytes(b"\0\n" * 900)
    assert long_files(tmp_path, 800) == [f"{tmp_path / 'a.py'}: 801 lines (at most 800)"]


# --- the checks on engagelake -------------------------------------------------------------------
def test_the_graph_is_read() -> None:
    graph = engagelake_graph()
    assert "engagelake" in graph and "engagelake.workspace" in graph and len(graph) > 50
    assert "engagelake.workspace" in graph["engagelake"]  # the facade's lazy import counts
    assert sum(map(len, graph.values())) > 100


def test_no_import_circle() -> None:
    cycles = find_cycles(engagelake_graph())
    assert not cycles, report("import circles", [" -> ".join(c) for c in cycles])


def test_layers() -> None:
    violations = layer_violations(engagelake_graph(), PACKAGE, LAYERS, INDEPENDENT, FORBIDDEN)
    assert not violations, report("imports against the layers", violations)


def test_no_file_over_max_lines() -> None:
    long = long_files(SRC, MAX_LINES)
    assert not long, report(f"files over {MAX_LINES} lines", long)


def test_ruff_bans_exist() -> None:
    missing: list[str] = []
    for folder, bans in RUFF_BANS.items():
        path = ROOT / folder / "ruff.toml"
        if not path.is_file():
            missing.append(f"{folder}/ruff.toml: no such file")
            continue
        banned = tomllib.loads(path.read_text()).get("lint", {}).get("flake8-tidy-imports", {}).get("banned-api", {})
        missing += [f"{folder}/ruff.toml: does not ban {ban}" for ban in sorted(bans - set(banned))]
    assert not missing, report("ruff bans missing", missing)
