"""The import rules of docs/architecture.md, checked on the source (no imports run).

The layers are listed once, in the table of docs/architecture.md ("Layers"); this test
parses it. Every import of a ``hpcdp`` module (top-level or inside a function, relative
or absolute) is an edge between two parts (a folder of hpcdp/, or a top-level module).
The test fails on a part missing from the table, on an edge from a lower layer to a
higher one, on a circle between parts (of any layers), and on a private name (``_x``)
imported from another part.

Inside a folder: a folder with sub-parts has its own table in the doc (``<!-- layers
io -->``: its sub-folders and root modules), checked the same way among them; and in
every folder of the package, two modules that import each other (directly or round a
circle) fail, except in the folders of ``INNER_CIRCLES_ALLOWED``.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Imports allowed to break the rules: none. (A pair here would be skipped; keep it empty.)
PENDING: set[tuple[str, str]] = set()
# Parts the layer table names before they exist: none.
PENDING_PARTS: set[str] = set()
# Folders whose modules may import each other in a circle (folder -> why), each until
# its owner removes the circle; an entry whose folder has no circle left fails (remove it
# then). None today: keep it empty.
INNER_CIRCLES_ALLOWED: dict[str, str] = {}
PKG = ROOT / "hpcdp"
DOC = ROOT / "docs" / "architecture.md"


def layer_table() -> dict[str, int]:
    """part -> layer number, from the table between the layer markers of the doc."""
    text = DOC.read_text()
    m = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    assert m, f"{DOC}: no <!-- layers --> ... <!-- /layers --> table"
    layers: dict[str, int] = {}
    for line in m.group(1).splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if not row:
            continue
        for part in re.findall(r"`([a-z_]+)/?`", row.group(2)):
            assert part not in layers, f"{DOC}: {part} is listed in two layers"
            layers[part] = int(row.group(1))
    assert layers, f"{DOC}: the layer table has no rows"
    return layers


def inner_tables() -> dict[str, dict[str, int]]:
    """folder -> {sub-part: layer}, from the ``<!-- layers FOLDER -->`` tables of the doc
    (a sub-part: a sub-folder or a module at the folder's root, as ``format/`` or ``errors``)."""
    text = DOC.read_text()
    out: dict[str, dict[str, int]] = {}
    for folder, body in re.findall(r"<!-- layers ([a-z_/]+) -->(.*?)<!-- /layers \1 -->", text, re.S):
        table: dict[str, int] = {}
        for line in body.splitlines():
            row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
            if row:
                for part in re.findall(r"`([a-z_0-9]+)/?`", row.group(2)):
                    assert part not in table, f"{DOC}: {folder}/: {part} is listed in two layers"
                    table[part] = int(row.group(1))
        assert table, f"{DOC}: the layer table of {folder}/ has no rows"
        out[folder] = table
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def part_of(module: str) -> str:
    """``hpcdp.comm.ring`` -> ``comm``; ``hpcdp.train`` -> ``train``; ``hpcdp`` -> ``hpcdp``."""
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "hpcdp"


def imports_of(path: Path, modules: set[str]):
    """(target module, names imported, line) for every hpcdp import in the file.
    ``from package import submodule`` is an edge to the submodule, not the package
    (its ``__init__`` runs first, but nothing of it is used)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hpcdp":
                    yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hpcdp":
                continue
            names = [a.name for a in node.names]
            subs = [n for n in names if f"{target}.{n}" in modules]
            if len(subs) < len(names):  # a name the package itself defines (or re-exports)
                yield target, names, node.lineno
            for name in subs:  # ``from hpcdp.comm import volume``: the submodule only
                yield f"{target}.{name}", [], node.lineno


@functools.lru_cache(maxsize=1)
def edges() -> tuple:
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    out = []
    for f in files:
        me = module_name(f)
        for target, names, line in imports_of(f, modules):
            if (me, target) in PENDING:
                continue
            out.append((me, target, tuple(names), f"{f.relative_to(ROOT)}:{line}"))
    return tuple(out)


def test_every_part_of_the_package_is_in_the_layer_table():
    layers = layer_table()
    parts = {part_of(module_name(f)) for f in PKG.rglob("*.py")}
    missing = sorted(parts - set(layers))
    assert not missing, (f"parts of hpcdp missing from the layer table of {DOC.name}: {missing}; "
                         "add each to the layer it belongs to")
    gone = sorted(set(layers) - parts - PENDING_PARTS)
    assert not gone, f"the layer table of {DOC.name} names parts that do not exist: {gone}"


def test_no_import_runs_up_a_layer():
    layers = layer_table()
    bad = []
    for me, target, _, where in edges():
        a, b = part_of(me), part_of(target)
        if a != b and layers.get(b, -1) > layers.get(a, -1):
            bad.append(f"{where}: {me} (layer {layers.get(a)}) imports {target} (layer {layers.get(b)})")
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one node (the circles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_strongly_connected_finds_a_circle_and_nothing_else():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_circle_between_parts():
    graph: dict[str, set[str]] = {}
    where: dict[tuple, str] = {}
    for me, target, _, at in edges():
        a, b = part_of(me), part_of(target)
        if a != b:
            graph.setdefault(a, set()).add(b)
            where.setdefault((a, b), f"{at} ({me} -> {target})")
    circles = strongly_connected(graph)
    lines = []
    for comp in circles:
        lines.append(f"circle {' <-> '.join(comp)}:")
        lines += [f"  {where[(a, b)]}" for a in comp for b in comp if (a, b) in where]
    assert not circles, "imports that close a circle between parts:\n" + "\n".join(lines)


def test_no_private_name_is_imported_from_another_part():
    bad = []
    for me, target, names, where in edges():
        if part_of(me) == part_of(target):
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private or any(p.startswith("_") and not p.startswith("__") for p in target.split(".")[1:]):
            bad.append(f"{where}: {me} imports {', '.join(private) or target} from {target}")
    assert not bad, "private names used across parts (add a public hook there):\n" + "\n".join(bad)


def test_no_private_name_of_another_part_is_used_through_its_module():
    """``import hpcdp.x.y as m`` / ``from hpcdp.x import y`` then ``m._name`` counts as well."""
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    bad = []
    for f in files:
        me = module_name(f)
        aliases = {}
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules and a.asname:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hpcdp"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                target = aliases[node.value.id]
                if part_of(target) != part_of(me) and (me, target) not in PENDING:
                    bad.append(f"{f.relative_to(ROOT)}:{node.lineno}: {me} uses {target}.{node.attr}")
    assert not bad, "private names used across parts (add a public hook there):\n" + "\n".join(bad)


def test_the_rules_see_lazy_relative_and_package_imports():
    """The walker finds imports inside functions, relative ones and ``from pkg import mod``."""
    found = {(m, t) for m, t, _, _ in edges()}
    assert ("hpcdp.cli", "hpcdp.launch") in found  # inside a function
    assert ("hpcdp.comm.model.cost", "hpcdp.comm.model.volume") in found  # from hpcdp.comm import volume
    assert any(m.startswith("hpcdp.io.") and t == "hpcdp.io.errors" for m, t in found)  # relative


# -- inside a folder -----------------------------------------------------------------

def files_by_module() -> dict[str, Path]:
    return {module_name(f): f for f in sorted(PKG.rglob("*.py"))}


def folder_of(module: str, files: dict[str, Path]) -> str:
    """The folder a module lives in, relative to hpcdp/ (``hpcdp.io.format.h5`` ->
    ``io/format``; a package's ``__init__`` is in its own folder)."""
    bits = module.split(".")
    if files[module].name != "__init__.py":
        bits = bits[:-1]
    return "/".join(bits[1:])


def inner_part(module: str, folder: str) -> str | None:
    """``hpcdp.io.format.h5`` in ``io`` -> ``format``; ``hpcdp.io.errors`` -> ``errors``;
    the folder's own ``__init__`` (and anything outside it) -> None."""
    prefix = "hpcdp." + folder.replace("/", ".") + "."
    return module[len(prefix):].split(".")[0] if module.startswith(prefix) else None


def sub_part_problems(edge_list, tables: dict[str, dict[str, int]]) -> list[str]:
    """Imports up a folder's inner layers, and circles between its sub-parts."""
    lines = []
    for folder, table in tables.items():
        graph: dict[str, set[str]] = {}
        where: dict[tuple, str] = {}
        for me, target, _, at in edge_list:
            a, b = inner_part(me, folder), inner_part(target, folder)
            if not (a and b and a != b):
                continue
            if table.get(b, -1) > table.get(a, -1):
                lines.append(f"{at}: {me} ({folder}/ layer {table.get(a)}) imports {target} (layer {table.get(b)})")
            graph.setdefault(a, set()).add(b)
            where.setdefault((a, b), f"{at} ({me} -> {target})")
        for comp in strongly_connected(graph):
            lines.append(f"{folder}/: circle {' <-> '.join(comp)}:")
            lines += [f"  {where[(a, b)]}" for a in comp for b in comp if (a, b) in where]
    return lines


def inner_circles(edge_list, files: dict[str, Path]) -> dict[str, list[str]]:
    """folder -> lines naming each circle among its own modules and the imports that
    close it (imports inside functions count)."""
    graph: dict[str, set[str]] = {}
    where: dict[tuple, str] = {}
    for me, target, _, at in edge_list:
        if target in files and me != target and folder_of(me, files) == folder_of(target, files):
            graph.setdefault(me, set()).add(target)
            where.setdefault((me, target), at)
    out: dict[str, list[str]] = {}
    for comp in strongly_connected(graph):
        lines = out.setdefault(folder_of(comp[0], files), [])
        lines.append(f"{folder_of(comp[0], files)}/: circle {' <-> '.join(comp)}:")
        lines += [f"  {where[(a, b)]} ({a} -> {b})" for a in comp for b in comp if (a, b) in where]
    return out


def allowed(folder: str) -> bool:
    return any(folder == f or folder.startswith(f + "/") for f in INNER_CIRCLES_ALLOWED)


def test_each_inner_table_lists_every_sub_part_of_its_folder():
    tables = inner_tables()
    assert "io" in tables and "comm" in tables, f"{DOC}: no <!-- layers io --> or <!-- layers comm --> table"
    files = files_by_module()
    for folder, table in tables.items():
        parts = {p for m in files if (p := inner_part(m, folder)) is not None}
        missing, gone = sorted(parts - set(table)), sorted(set(table) - parts)
        assert not missing, f"{DOC}: sub-parts of {folder}/ missing from its layer table: {missing}"
        assert not gone, f"{DOC}: the layer table of {folder}/ names parts that do not exist: {gone}"


def test_no_import_runs_up_or_round_a_circle_between_the_sub_parts_of_a_folder():
    lines = sub_part_problems(edges(), inner_tables())
    assert not lines, "imports up a folder's layers, or round a circle of its sub-parts:\n" + "\n".join(lines)


def test_no_circle_between_two_modules_of_one_folder():
    circles = inner_circles(edges(), files_by_module())
    lines = [x for folder, ls in sorted(circles.items()) if not allowed(folder) for x in ls]
    assert not lines, "modules of one folder that import each other (round a circle):\n" + "\n".join(lines)


def test_the_inner_circle_allowlist_names_only_folders_with_a_circle():
    circled = set(inner_circles(edges(), files_by_module()))
    stale = [f for f in INNER_CIRCLES_ALLOWED if not any(c == f or c.startswith(f + "/") for c in circled)]
    assert not stale, f"INNER_CIRCLES_ALLOWED names folders without an inner circle now: {stale}; remove them"


def test_the_inner_checks_fail_on_a_circle_or_an_upward_import():
    """On made-up imports: io's old direct <-> h5 pair fails as a circle of one folder's
    modules, and, across io/'s sub-folders, as a circle and an import up a layer."""
    files = {m: Path(f"{m.rsplit('.', 1)[-1]}.py") for m in
             ("hpcdp.io.direct", "hpcdp.io.h5", "hpcdp.io.disk.direct", "hpcdp.io.format.h5", "hpcdp.io.errors")}
    files["hpcdp.io"] = Path("__init__.py")
    flat = [("hpcdp.io.direct", "hpcdp.io.h5", (), "direct.py:1"), ("hpcdp.io.h5", "hpcdp.io.direct", (), "h5.py:2")]
    assert inner_circles(flat, files) == {"io": ["io/: circle hpcdp.io.direct <-> hpcdp.io.h5:",
                                                 "  direct.py:1 (hpcdp.io.direct -> hpcdp.io.h5)",
                                                 "  h5.py:2 (hpcdp.io.h5 -> hpcdp.io.direct)"]}
    assert inner_circles(flat[:1], files) == {}
    split = [("hpcdp.io.disk.direct", "hpcdp.io.format.h5", (), "direct.py:1"),
             ("hpcdp.io.format.h5", "hpcdp.io.disk.direct", (), "h5.py:2"),
             ("hpcdp.io.format.h5", "hpcdp.io.errors", (), "h5.py:3")]
    table = {"io": {"errors": 0, "disk": 1, "format": 2}}
    lines = sub_part_problems(split, table)
    assert any("io/ layer 1) imports hpcdp.io.format.h5 (layer 2)" in x for x in lines), lines
    assert "io/: circle disk <-> format:" in lines, lines
    assert sub_part_problems(split[1:], table) == []
    assert inner_part("hpcdp.io", "io") is None and folder_of("hpcdp.io", files) == "io"


# -- comm/ from outside: its public names only -----------------------------------------

# Outside comm/, the collectives are used through the package's public names
# (``hpcdp.comm.__all__``), plus these modules of it (docs/architecture.md, "Seams"): the
# errors, the [comm] settings, and the model (pure arithmetic, no MPI).
COMM_OPEN_MODULES = ("hpcdp.comm.core.errors", "hpcdp.comm.core.settings", "hpcdp.comm.model")


def comm_public_names() -> set[str]:
    """``__all__`` of hpcdp/comm/__init__.py, read from its source."""
    tree = ast.parse((PKG / "comm" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("hpcdp/comm/__init__.py has no __all__")


def comm_private_uses(edge_list, public: set[str]) -> list[str]:
    """Imports from outside comm/ of a comm module that is not open, or of a name the
    package does not make public."""
    bad = []
    for me, target, names, where in edge_list:
        if part_of(me) == "comm" or part_of(target) != "comm":
            continue
        if target == "hpcdp.comm":
            hidden = [n for n in names if n not in public]
            if hidden:
                bad.append(f"{where}: {me} imports {', '.join(hidden)} from hpcdp.comm (not in its __all__)")
        elif not any(target == m or target.startswith(m + ".") for m in COMM_OPEN_MODULES):
            bad.append(f"{where}: {me} imports {target} (inside comm/: use hpcdp.comm's public names)")
    return bad


def comm_private_attributes(public: set[str]) -> list[str]:
    """``import hpcdp.comm as C`` / ``from hpcdp import comm`` then ``C.x`` outside comm/:
    ``x`` must be public."""
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        me = module_name(f)
        if part_of(me) == "comm":
            continue
        tree = ast.parse(f.read_text(), str(f))
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.name == "hpcdp.comm" and a.asname}
            elif isinstance(node, ast.ImportFrom) and node.module == "hpcdp" and not node.level:
                aliases |= {a.asname or a.name for a in node.names if a.name == "comm"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and node.attr not in public:
                bad.append(f"{f.relative_to(ROOT)}:{node.lineno}: {me} uses hpcdp.comm.{node.attr}")
    return bad


def test_outside_comm_only_its_public_names_are_imported():
    public = comm_public_names()
    bad = comm_private_uses(edges(), public) + comm_private_attributes(public)
    assert not bad, ("modules outside comm/ reaching inside it (use a name of hpcdp.comm.__all__, "
                     "or add one there):\n" + "\n".join(bad))


def test_the_comm_rule_fails_on_an_inner_module_or_a_hidden_name():
    public = {"allreduce", "plan"}
    made_up = [("hpcdp.strategies.ddp", "hpcdp.comm.engines.compiled.engine", (), "ddp.py:1"),
               ("hpcdp.strategies.ddp", "hpcdp.comm", ("allreduce", "overlap_algorithm"), "ddp.py:2"),
               ("hpcdp.strategies.ddp", "hpcdp.comm", ("plan",), "ddp.py:3"),
               ("hpcdp.strategies.zero.hybrid", "hpcdp.comm.core.settings", (), "hybrid.py:4"),
               ("hpcdp.scale.model", "hpcdp.comm.model.cost", (), "model.py:5"),
               ("hpcdp.comm.select", "hpcdp.comm.engines.compiled.engine", (), "select.py:6")]
    assert comm_private_uses(made_up, public) == [
        "ddp.py:1: hpcdp.strategies.ddp imports hpcdp.comm.engines.compiled.engine (inside comm/: "
        "use hpcdp.comm's public names)",
        "ddp.py:2: hpcdp.strategies.ddp imports overlap_algorithm from hpcdp.comm (not in its __all__)"]
    assert "two_level" in comm_public_names() and "TopologyError" in comm_public_names()
