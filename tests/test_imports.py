"""No import cycles, lazy or not, and imports that flow one way through the layers.

Two checks: every module of `specsample` imports alone in a fresh interpreter (a cycle of
top-level imports fails there), and the graph of every import statement in `specsample/`
and `backends/`, read from the source (including those inside functions and under
`TYPE_CHECKING`), has no cycle and no import against the layer order.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import specsample

# `__main__` modules run the command line when imported: they are entry points, not modules.
MODULES = sorted(m.name for m in pkgutil.walk_packages(specsample.__path__, "specsample.")
                 if not m.name.endswith(".__main__"))


# Third-party libraries are imported once and shared by every fork: the test is about
# `specsample`'s own modules, and a fresh interpreter per module would import torch 60 times.
SHARED = ("numpy", "scipy.stats", "torch", "torch._dynamo", "transformers", "jinja2", "tqdm",
          "array_api_compat", "matplotlib.pyplot")

DRIVER = """
import importlib, json, os, sys
names, shared = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for lib in shared:
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
errors = {}
for name in names:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child imports one module into an interpreter where no first-party module is loaded
        os.close(read)
        try:
            importlib.import_module(name)
            message = ""
        except BaseException as error:
            message = f"{type(error).__name__}: {error}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    message = b"".join(chunks).decode()
    if message or status:
        errors[name] = (message.strip().splitlines() or [f"exit status {status}"])[-1]
print(json.dumps(errors))
"""


def import_alone(names: Sequence[str], path: Path | None = None,
                 shared: Sequence[str] = SHARED) -> dict[str, str]:
    """{module: last line of its error} for each module that fails `import` on its own: each is
    imported in a fork of an interpreter that has loaded only third-party libraries."""
    env = None if path is None else {**os.environ, "PYTHONPATH": str(path)}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(list(names)), json.dumps(list(shared))],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr
    errors: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return errors


def test_every_module_is_listed() -> None:
    assert {"specsample.bench", "specsample.bench.models", "specsample.cli", "specsample.cli._bench",
            "specsample.engine.generate", "specsample.core.verify", "specsample.testing"} <= set(MODULES)


def test_every_module_imports_alone() -> None:
    errors = import_alone(MODULES)
    cycles = {n: e for n, e in errors.items() if "partially initialized" in e}
    assert not cycles, f"import cycles: {cycles}"
    assert not errors, f"modules that do not import alone: {errors}"


def test_a_cycle_is_caught(tmp_path: Path) -> None:
    """Negative control: two modules that import names from each other fail alone."""
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic.b import B\nA = 1\n")
    (package / "b.py").write_text("from cyclic.a import A\nB = 2\n")
    errors = import_alone(["cyclic.a", "cyclic"], tmp_path, shared=())
    assert list(errors) == ["cyclic.a"] and "partially initialized" in errors["cyclic.a"]


# The layers, lowest first: a module may import its own layer and those below it. The
# private base modules (`_array`, `_moved`) and the package itself sit outside the order.
LAYERS = ("kernels", "core", "drafters", "engine", "api", "tools")
TOOLS = ("bench", "cli", "testing")
ROOT = Path(__file__).resolve().parents[1]
TOPS = {"specsample": ROOT / "specsample", "specsample_backends": ROOT / "backends"}


def module_files(tops: dict[str, Path]) -> dict[str, Path]:
    """{dotted module name: source file} under each top package's folder."""
    found = {}
    for top, folder in tops.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((top, *parts))] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports anywhere in its source, at top level, inside
    functions or under TYPE_CHECKING (`from P import m` counts module P.m where it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(tops: dict[str, Path]) -> dict[str, set[str]]:
    files = module_files(tops)
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), or with a self-loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(name: str) -> int | None:
    """The rank of `specsample` module `name` in `LAYERS` (None: outside the order)."""
    part = name.split(".")[1] if name.count(".") >= 1 else ""
    if part in TOOLS:
        return LAYERS.index("tools")
    return LAYERS.index(part) if part in LAYERS else None


def against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a `specsample` module into a module of a lower layer."""
    wrong = []
    for name, targets in graph.items():
        here = layer(name)
        for target in targets:
            there = layer(target)
            if here is not None and there is not None and there > here:
                wrong.append(f"{name} -> {target}")
    return sorted(wrong)


def test_no_import_cycle_lazy_or_not() -> None:
    graph = import_graph(TOPS)
    assert len(graph) > 100
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_imports_flow_down_the_layers() -> None:
    graph = import_graph(TOPS)
    assert not against_the_layers(graph), f"imports against the layer order: {against_the_layers(graph)}"
    core = [n for n in graph if layer(n) in (LAYERS.index("core"), LAYERS.index("kernels"))]
    assert core and all(not t.startswith(("specsample.testing", "specsample.bench", "specsample.cli"))
                        for n in core for t in graph[n])


def test_a_lazy_cycle_and_an_upward_import_are_caught(tmp_path: Path) -> None:
    """Negative control: a cycle closed by an import inside a function, and one under
    TYPE_CHECKING, are found; so is a core module importing the testing kit."""
    package = tmp_path / "specsample"
    for sub in ("core", "engine", "testing"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "engine" / "round.py").write_text("from specsample.core.verify import verify\n")
    (package / "core" / "verify.py").write_text(
        "def verify():\n    from specsample.engine import round\n    return round\n")
    (package / "core" / "warp.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specsample.core import sample\n")
    (package / "core" / "sample.py").write_text("from . import warp\n")
    (package / "core" / "params.py").write_text("import specsample.testing.broken\n")
    (package / "testing" / "broken.py").write_text("")
    graph = import_graph({"specsample": package})
    assert sorted(cycles(graph)) == [["specsample.core.sample", "specsample.core.warp"],
                                     ["specsample.core.verify", "specsample.engine.round"]]
    assert against_the_layers(graph) == ["specsample.core.params -> specsample.testing.broken",
                                         "specsample.core.verify -> specsample.engine.round"]


def test_an_old_path_leaves_the_function_of_its_name_in_place() -> None:
    """Importing `specsample.generate` (an old module path) in a fresh process keeps
    `specsample.generate` the function; so for every exported name an old path shares."""
    import subprocess
    import sys

    names = ["generate", "verify", "verify_block", "verify_tree", "sample", "warp"]
    code = ("import types, warnings, importlib, specsample\n"
            "warnings.simplefilter('ignore', DeprecationWarning)\n"
            f"for name in {names!r}:\n"
            "    assert callable(getattr(specsample, name)), name\n"
            "    importlib.import_module('specsample.' + name)\n"
            "    value = getattr(specsample, name)\n"
            "    assert not isinstance(value, types.ModuleType), name\n"
            "    assert value is getattr(importlib.import_module('specsample'), name)\n"
            "assert isinstance(specsample.rng, types.ModuleType)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_flat_layout_paths_still_import() -> None:
    """The module paths of the flat layout give the moved modules themselves, with a warning."""
    import importlib
    import warnings

    from specsample import _moved

    for old, new in _moved.MOVED.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
    assert specsample.rng is importlib.import_module("specsample.core.rng")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        specsample.nothing  # noqa: B018
