"""Dependencies: each third-party import is declared, each declared one is used, and the
optional ones (scipy: `testing`, numba: `fast`) are not needed by `import specsample`, the
warp or a generate, which give the same results without them; `specsample.testing` without
scipy fails with an ImportError that says what to install."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SOURCES = (ROOT / "specsample", ROOT / "backends")
# Extras outside the scan: the tools around the library (tests, docs), and the Gaudi stack,
# whose modules the gaudi backend imports by name when it starts.
TOOL_EXTRAS = {"dev", "docs", "gaudi"}
# Imported, and installed by a declared distribution that pins it: numba's own llvmlite, whose
# IR the compiled passes' intrinsics build.
INSTALLED_WITH = {"llvmlite": "numba"}
# Declared and imported by nothing here: transformers reads GGUF files through gguf, and loads
# none without accelerate.
USED_BY_TRANSFORMERS = {"gguf", "accelerate"}


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement, lower case."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def _import_name(distribution: str) -> str:
    """The module a distribution installs (array-api-compat: array_api_compat)."""
    return distribution.replace("-", "_")


def declared(project: dict[str, Any]) -> dict[str, set[str]]:
    """{distribution: where it is declared ("" for the dependencies, else the extra's name)}."""
    found: dict[str, set[str]] = {}
    groups = {"": project["dependencies"], **project.get("optional-dependencies", {})}
    for group, requirements in groups.items():
        for requirement in requirements:
            found.setdefault(_name(requirement), set()).add(group)
    return found


def imported(folders: tuple[Path, ...]) -> set[str]:
    """The top-level names of the third-party modules that the sources under `folders` import,
    anywhere in a module (top level, functions, TYPE_CHECKING)."""
    names = set()
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"specsample", "specsample_backends"}


def undeclared(project: dict[str, Any], modules: set[str]) -> list[str]:
    """The imported modules that neither the dependencies nor a library extra install."""
    runtime = {_import_name(d) for d, groups in declared(project).items() if groups - TOOL_EXTRAS}
    return sorted(m for m in modules if m not in runtime and INSTALLED_WITH.get(m) not in runtime)


def unused(project: dict[str, Any], modules: set[str]) -> list[str]:
    """The distributions of the dependencies and library extras that no module imports."""
    return sorted(d for d, groups in declared(project).items() if groups - TOOL_EXTRAS
                  and _import_name(d) not in modules and d not in USED_BY_TRANSFORMERS)


def test_every_third_party_import_is_declared_and_every_declared_library_imported() -> None:
    modules = imported(SOURCES)
    assert {"numpy", "scipy", "numba", "torch", "safetensors"} <= modules  # the scan reads the imports
    assert undeclared(PROJECT, modules) == []
    assert unused(PROJECT, modules) == []


def test_a_missing_and_an_unused_declaration_are_caught(tmp_path: Path) -> None:
    """Negative control: an import with no declaration, and a declaration with no import."""
    (tmp_path / "head.py").write_text("def load():\n    from safetensors.torch import load_file\n")
    (tmp_path / "warp.py").write_text("import numpy as np\nfrom numba import njit\nimport llvmlite.ir\n")
    project = {"dependencies": ["numpy>=1.26", "Left_Over>=1; python_version < '3.11'"],
               "optional-dependencies": {"fast": ["numba"], "dev": ["safetensors"]}}
    modules = imported((tmp_path,))
    assert modules == {"numpy", "numba", "llvmlite", "safetensors"}
    assert undeclared(project, modules) == ["safetensors"]  # a tool extra does not count
    assert unused(project, modules) == ["left-over"]


def test_scipy_and_numba_are_extras_and_the_default_set_ups_keep_them() -> None:
    found = declared(PROJECT)
    assert found["scipy"] == {"testing", "hf", "dev"}
    assert found["numba"] == {"fast", "hf", "dev"}
    assert {"safetensors", *USED_BY_TRANSFORMERS} <= {d for d, groups in found.items() if "hf" in groups}
    assert not {"scipy", "numba", "torch", "transformers"} & {_name(r) for r in PROJECT["dependencies"]}


# Run in a fresh interpreter with the modules named in argv[1] made unimportable (a None in
# sys.modules makes `import name` and `import name.sub` raise ImportError): what `import
# specsample` loads, which modules of the library import, a top-p warp on NumPy and a generate
# on the reference backend (with the compiled pass's calls counted), and the errors of
# `specsample.testing` and of a bootstrap interval.
PROBE = r"""
import hashlib, importlib, json, pkgutil, sys
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None
before = set(sys.modules)
import numpy as np
import specsample
from specsample.kernels import dispatch
loaded = sorted({m.split(".")[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names))
out = {"loaded": loaded, "available": dispatch.available(), "failed": {}}
for name in ("numba", "scipy"):
    try:
        importlib.import_module(name)
        out[name] = True
    except ImportError:
        out[name] = False
for package in ("specsample.kernels", "specsample.core", "specsample.drafters", "specsample.engine",
                "specsample.api", "specsample.bench"):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as error:
            out["failed"][info.name] = str(error)
calls = [0]
top_p_rows = dispatch.top_p_rows
def counted(*args, **kwargs):
    calls[0] += 1
    return top_p_rows(*args, **kwargs)
dispatch.top_p_rows = counted
logits = np.random.default_rng(0).normal(size=(4, 4096)) * 3.0
probs = specsample.warp(logits, specsample.SamplingParams(temperature=0.7, top_p=0.9))
out["warp"] = [str(probs.dtype), list(probs.shape), hashlib.sha256(probs.tobytes()).hexdigest()]
out["warp_calls"] = calls[0]
backend = specsample.get_backend("reference")
target = backend.load_target("ngram:vocab=1024,order=1,seed=1")
prompts = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
generation = specsample.generate(target, backend.load_drafter(None, target), prompts, max_new_tokens=16,
                                 params=specsample.SamplingParams(temperature=0.7, top_p=0.9), k=3, seed=4)
out["generate"] = generation.sequences.tolist()
out["generate_calls"] = calls[0] - out["warp_calls"]
from tests.golden_runs import GOLDEN, run
name = "reference/noisy/T0.7-topp"
out["golden"] = run(name) == json.loads(GOLDEN.read_text())[name]
for key, attempt in (("testing", lambda: importlib.import_module("specsample.testing")),
                     ("bootstrap", lambda: specsample.bench.bootstrap_interval([1.0, 2.0, 4.0]))):
    try:
        attempt()
        out[key] = None
    except ImportError as error:
        out[key] = str(error)
print(json.dumps(out))
"""


def _probe(blocked: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(blocked)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


Probes = tuple[dict[str, Any], dict[str, Any]]


@pytest.fixture(scope="module")
def probes() -> Probes:
    """The probe with every library installed here, and without scipy and numba."""
    return _probe([]), _probe(["numba", "scipy"])


def test_the_probe_blocks_what_it_names(probes: Probes) -> None:
    # Negative control: here both are installed, the compiled pass runs and the toolkit imports;
    # blocked, neither imports.
    full, bare = probes
    assert full["numba"] and full["scipy"] and full["available"]
    assert full["testing"] is None and full["bootstrap"] is None
    assert not bare["numba"] and not bare["scipy"]


def test_import_specsample_loads_only_the_core_dependencies(probes: Probes) -> None:
    full, bare = probes
    core = {_import_name(d) for d, groups in declared(PROJECT).items() if "" in groups}
    for probe in probes:
        assert set(probe["loaded"]) - {"specsample", "specsample_backends"} <= core, probe["loaded"]
    assert full["loaded"] == bare["loaded"]


def test_without_numba_the_compiled_passes_fall_back(probes: Probes) -> None:
    full, bare = probes
    assert not bare["available"]
    # Every module of the library but the compiled passes imports without scipy and numba
    # (`tests/test_imports.py` checks that every one imports where they are installed).
    assert set(bare["failed"]) - set(full["failed"]) == {"specsample.kernels.compiled"}
    assert "numba" in bare["failed"]["specsample.kernels.compiled"]
    # The top-p warp and the generate take the compiled pass here and the NumPy path there,
    # with the same bits and tokens, and the recorded tokens stay as recorded.
    assert full["warp_calls"] > 0 and full["generate_calls"] > 0
    assert bare["warp_calls"] == bare["generate_calls"] == 0
    assert bare["warp"] == full["warp"] and bare["warp"][:2] == ["float64", [4, 4096]]
    assert bare["generate"] == full["generate"]
    assert full["golden"] and bare["golden"]


def test_without_scipy_the_toolkit_says_what_to_install(probes: Probes) -> None:
    _, bare = probes
    assert bare["testing"].startswith("specsample.testing needs scipy")
    assert "pip install 'specsample[testing]'" in bare["testing"]
    assert bare["bootstrap"].startswith("bootstrap_interval: needs scipy")
    assert "pip install 'specsample[testing]'" in bare["bootstrap"]
