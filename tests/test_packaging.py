"""The built wheel: `backends/` ships as `specsample_backends`, every backend imports from it,
and its metadata requires the core's few libraries, the optional ones in extras."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("reference", "torch", "static", "cuda", "gaudi")
# What a build needs; copied so that building leaves no build/ or egg-info in the checkout.
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "specsample"
    shutil.copytree(ROOT, source, ignore=SKIP)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = sorted(out.glob("specsample-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
         str(wheel)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return target


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_wheel_namespaces_backends(wheel: Path) -> None:
    names = _names(wheel)
    assert "specsample/__init__.py" in names
    assert "specsample/py.typed" in names
    assert "specsample_backends/__init__.py" in names
    assert "specsample_backends/reference/ngram.py" in names
    assert not [n for n in names if n.split("/")[0] == "backends"]
    assert not [n for n in names if n.startswith("tests/")]
    with zipfile.ZipFile(wheel) as archive:
        top = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert set(archive.read(top).decode().split()) == {"specsample", "specsample_backends"}


def test_wheel_ships_every_source_module(wheel: Path) -> None:
    names = set(_names(wheel))
    for package, prefix in (("specsample", "specsample"), ("backends", "specsample_backends")):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT / package).as_posix()
            assert f"{prefix}/{relative}" in names, f"{package}/{relative} is missing from the wheel"


@pytest.mark.parametrize("backend", BACKENDS)
def test_wheel_ships_every_backend_package(wheel: Path, backend: str) -> None:
    assert f"specsample_backends/{backend}/__init__.py" in _names(wheel)


def _run_installed(installed: Path, tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_installed_copy_is_imported(installed: Path, tmp_path: Path) -> None:
    code = ("import specsample, specsample_backends, specsample_backends.reference as r; "
            "print(specsample.__file__); print(specsample_backends.__file__); print(r.__file__); "
            "print(specsample.get_backend('reference').name)")
    result = _run_installed(installed, tmp_path, code)
    assert result.returncode == 0, result.stderr
    *files, name = result.stdout.split()
    assert name == "reference"
    for file in files:
        assert Path(file).resolve().is_relative_to(installed.resolve()), file


def test_no_top_level_backends_module(installed: Path, tmp_path: Path) -> None:
    assert not (installed / "backends").exists()
    result = _run_installed(installed, tmp_path, "import importlib.util as u; print(u.find_spec('backends'))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


@pytest.mark.parametrize("backend", BACKENDS)
def test_installed_backend_imports(installed: Path, tmp_path: Path, backend: str) -> None:
    module = f"specsample_backends.{backend}"
    code = f"import specsample, {module} as m; print(specsample.__file__); print(m.__file__)"
    result = _run_installed(installed, tmp_path, code)
    assert result.returncode == 0, result.stderr
    for file in result.stdout.split():
        assert file != "None", f"{module} is a bare namespace package (no __init__.py), not a backend"
        assert Path(file).resolve().is_relative_to(installed.resolve()), file


def test_wheel_ships_the_draft_head_and_its_card(wheel: Path) -> None:
    names = _names(wheel)
    for name in ("smollm2-135m-instruct", "smollm2-135m-instruct-v1"):  # the default and v1
        for suffix in (".safetensors", ".json"):
            assert f"specsample_backends/torch/heads/{name}{suffix}" in names


def test_wheel_requires_only_the_core_and_puts_scipy_and_numba_in_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in _names(wheel) if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.partition(":")[2].strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    extras = {line.partition(":")[2].strip() for line in metadata.splitlines()
              if line.startswith("Provides-Extra:")}

    def names(extra: str | None) -> set[str]:
        """The distributions required with `extra` (None: always)."""
        marker = None if extra is None else f'extra == "{extra}"'
        return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requires
                if (marker is None and "extra ==" not in r) or (marker is not None and marker in r)}

    assert names(None) == {"numpy", "array-api-compat", "tqdm", "tomli"}
    assert {"fast", "testing", "hf", "dev"} <= extras
    assert names("fast") == {"numba"} and names("testing") == {"scipy"}
    assert {"scipy", "numba", "safetensors", "transformers"} <= names("hf")
    assert {"scipy", "numba"} <= names("dev")
