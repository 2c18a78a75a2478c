"""No import cycles: every module of `specsample` imports alone, in a fresh interpreter."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import specsample

# `__main__` modules run the command line when imported: they are entry points, not modules.
MODULES = sorted(m.name for m in pkgutil.walk_packages(specsample.__path__, "specsample.")
                 if not m.name.endswith(".__main__"))


def import_alone(names: Sequence[str], path: Path | None = None, *, parallel: int = 4) -> dict[str, str]:
    """{module: last line of its error} for each module that fails `import` in a fresh interpreter."""
    prefix = f"import sys; sys.path.insert(0, {str(path)!r}); " if path is not None else ""
    errors: dict[str, str] = {}
    for start in range(0, len(names), parallel):
        running = {name: subprocess.Popen(
            [sys.executable, "-c", f"{prefix}import importlib; importlib.import_module({name!r})"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for name in names[start:start + parallel]}
        for name, process in running.items():
            _, err = process.communicate(timeout=300)
            if process.returncode != 0:
                errors[name] = (err.strip().splitlines() or ["(no message)"])[-1]
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
    errors = import_alone(["cyclic.a", "cyclic"], tmp_path)
    assert list(errors) == ["cyclic.a"] and "partially initialized" in errors["cyclic.a"]
