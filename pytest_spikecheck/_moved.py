"""Old module paths (0.1.0), kept importable for one release with a DeprecationWarning.

0.2.0 grouped the flat modules into layer subpackages (see the map in the package
docstring). ``import pytest_spikecheck.engine`` and friends still work through the finder
below, which hands back the module at its new path; CHANGELOG.md lists every move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old module path -> new module path
MOVED = {
    "pytest_spikecheck.engine": "pytest_spikecheck.training.engine",
    "pytest_spikecheck.probe": "pytest_spikecheck.training.probe",
    "pytest_spikecheck.distributed": "pytest_spikecheck.training.distributed",
    "pytest_spikecheck.schedule": "pytest_spikecheck.training.schedule",
    "pytest_spikecheck.clip_policy": "pytest_spikecheck.training.clip_policy",
    "pytest_spikecheck.breaks": "pytest_spikecheck.scenario.breaks",
    "pytest_spikecheck.presets": "pytest_spikecheck.scenario.presets",
    "pytest_spikecheck.run": "pytest_spikecheck.records.run",
    "pytest_spikecheck.logs": "pytest_spikecheck.records.logs",
    "pytest_spikecheck.detectors": "pytest_spikecheck.judge.detectors",
    "pytest_spikecheck.analysis": "pytest_spikecheck.judge.analysis",
    "pytest_spikecheck.diagnosis": "pytest_spikecheck.judge.diagnosis",
    "pytest_spikecheck.assertions": "pytest_spikecheck.judge.assertions",
    "pytest_spikecheck.strategies": "pytest_spikecheck.fuzz.strategies",
    "pytest_spikecheck.search": "pytest_spikecheck.fuzz.search",
    "pytest_spikecheck.session": "pytest_spikecheck.plugin.session",
    "pytest_spikecheck.fixtures": "pytest_spikecheck.plugin.fixtures",
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new_name} in pytest-spikecheck 0.2.0; the old path goes away "
                      f"in 0.3.0 (import from {self.new_name}, or the public names from pytest_spikecheck)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new_name)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(new_name))


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
