"""The module paths of the flat layout, kept importable after the move into subpackages.

`import specsample.round` (or `from specsample.round import State`) gives the module now
at `specsample.engine.round`, with a DeprecationWarning that names the new path; the
module object is the same, so state and identity checks are unaffected.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED = {
    "specsample.params": "specsample.core.params",
    "specsample.warp": "specsample.core.warp",
    "specsample.sample": "specsample.core.sample",
    "specsample.rng": "specsample.core.rng",
    "specsample.verify": "specsample.core.verify",
    "specsample.verify_block": "specsample.core.verify_block",
    "specsample.verify_tree": "specsample.core.verify_tree",
    "specsample.verifiers": "specsample.core.verifiers",
    "specsample.cache": "specsample.core.cache",
    "specsample.protocols": "specsample.core.protocols",
    "specsample.metrics": "specsample.core.metrics",
    "specsample.shard": "specsample.core.shard",
    "specsample.lookup": "specsample.drafters.lookup",
    "specsample.suffix": "specsample.drafters.suffix",
    "specsample.feature": "specsample.drafters.head",
    "specsample.hybrid": "specsample.drafters.hybrid",
    "specsample.round": "specsample.engine.round",
    "specsample.tree": "specsample.engine.tree",
    "specsample.generate": "specsample.engine.generate",
    "specsample.policy": "specsample.engine.policy",
    "specsample.options": "specsample.engine.options",
    "specsample.bench.cost": "specsample.engine.cost",
    "specsample.config": "specsample.api.config",
    "specsample.backend": "specsample.api.backend",
    "specsample.registry": "specsample.api.registry",
    "specsample.runner": "specsample.api.runner",
    "specsample.draft_names": "specsample.api.draft_names",
    "specsample.benchcore": "specsample.bench.core",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new one."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}; import it from there", DeprecationWarning,
                      stacklevel=2)
        # The import system returns what sys.modules holds under the old name once this returns.
        sys.modules[module.__name__] = importlib.import_module(new)


class _Package(ModuleType):
    """A package whose public functions keep their names when an old module path of the same
    name is imported.

    The import system binds a freshly loaded submodule as an attribute of its parent. Several
    old paths share a name with the function the package exports (`specsample.generate`,
    `specsample.verify`, `specsample.warp`, ...); without this guard, `import
    specsample.generate` anywhere in a process would replace the function `specsample.generate`
    with a module.
    """

    def __setattr__(self, name: str, value: object) -> None:
        current = self.__dict__.get(name)
        if (isinstance(value, ModuleType) and f"{self.__name__}.{name}" in MOVED
                and current is not None and not isinstance(current, ModuleType)):
            return
        super().__setattr__(name, value)


def install() -> None:
    """Put the alias finder on `sys.meta_path` (once) and guard the packages' exported names."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
    for parent in {old.rpartition(".")[0] for old in MOVED}:
        package = sys.modules.get(parent)
        if package is not None and type(package) is ModuleType:
            package.__class__ = _Package
