"""No import cycles: every module of `specsample` imports alone, in a fresh interpreter."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

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
            "specsample.generate", "specsample.testing"} <= set(MODULES)


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
