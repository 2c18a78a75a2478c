"""The registry: built-ins by name, third parties through entry points, torch never eager."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest

import specsample.api.registry as registry
from specsample.api.registry import BUILTIN, GROUP, available, get_backend

BUILTIN_NAMES = ["cuda", "gaudi", "reference", "static-cpu", "torch"]


class FakeEntryPoint:
    """Stands in for importlib.metadata.EntryPoint: only `.name` and `.load()` are used."""

    def __init__(self, name: str, factory: Any) -> None:
        self.name = name
        self._factory = factory
        self.loads = 0

    def load(self) -> Any:
        self.loads += 1
        return self._factory


class PluginBackend:
    name = "acme"

    def __init__(self, options: Mapping[str, object]) -> None:
        self.options = dict(options)


def _install_fake_plugins(monkeypatch: pytest.MonkeyPatch, *points: FakeEntryPoint) -> list[str]:
    groups: list[str] = []

    def fake_entry_points(*, group: str) -> list[FakeEntryPoint]:
        groups.append(group)
        return list(points) if group == GROUP else []

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    return groups


def test_group_name() -> None:
    assert GROUP == "specsample.backends"


def test_available_lists_builtins_sorted() -> None:
    names = available()
    assert set(BUILTIN_NAMES) <= set(names)
    assert names == sorted(names)
    assert sorted(BUILTIN) == BUILTIN_NAMES


def test_get_reference_backend() -> None:
    from specsample_backends.reference import ReferenceBackend

    backend = get_backend("reference")
    assert isinstance(backend, ReferenceBackend)
    assert backend.name == "reference"
    assert backend.asarray([1, 2]).dtype.name == "int64"
    assert get_backend("reference", {}).name == "reference"


def test_reference_backend_rejects_options() -> None:
    with pytest.raises(ValueError, match="options"):
        get_backend("reference", {"device": "cuda"})


def test_unknown_name_lists_available() -> None:
    with pytest.raises(ValueError, match=r"backend: unknown name 'tpu'; available: ") as info:
        get_backend("tpu")
    for name in BUILTIN_NAMES:
        assert name in str(info.value)


def test_name_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="backend: expected a name"):
        get_backend(None)  # type: ignore[arg-type]


def test_fake_entry_point_plugin_is_listed_and_created(monkeypatch: pytest.MonkeyPatch) -> None:
    point = FakeEntryPoint("acme", PluginBackend)
    groups = _install_fake_plugins(monkeypatch, point)
    assert "acme" in available()
    assert set(BUILTIN_NAMES) <= set(available())
    backend = get_backend("acme", {"device": "npu"})
    assert isinstance(backend, PluginBackend)
    assert backend.options == {"device": "npu"}
    assert point.loads == 1
    assert groups and set(groups) == {GROUP}


def test_fake_entry_point_unknown_name_lists_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_plugins(monkeypatch, FakeEntryPoint("acme", PluginBackend))
    with pytest.raises(ValueError, match=r"available: .*acme"):
        get_backend("acme2")


def test_fake_entry_point_not_loaded_for_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    point = FakeEntryPoint("acme", PluginBackend)
    _install_fake_plugins(monkeypatch, point)
    assert get_backend("reference").name == "reference"
    assert point.loads == 0


def test_importing_specsample_does_not_import_torch() -> None:
    code = ("import sys, specsample, specsample.api.registry; "
            "specsample.available(); specsample.get_backend('reference'); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'habana_frameworks'}); "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_bare_import_does_not_import_torch() -> None:
    code = "import specsample, sys; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
