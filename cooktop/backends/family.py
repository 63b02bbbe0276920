"""What a backend family says about itself: :class:`Family`, the ``FAMILY`` of each
``backends/<family>/`` package.

The registry, the probe child (:mod:`.safeprobe`), the smoke test, the bench and the tests
read a family only through this description, so none of them names a family: adding a
backend is one new folder whose ``__init__.py`` defines ``FAMILY``, plus one line in
:mod:`.families` (the family list).

Everything a family's ``__init__`` holds is cheap to import (no driver binding, no numpy
kernel code): the hooks are ``"module:function"`` strings, imported when called, so a
family whose binding is missing still describes itself (its install hint).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Backend


def _resolve(target: str) -> Any:
    mod, _, attr = target.partition(":")
    return getattr(importlib.import_module(mod), attr)


@dataclasses.dataclass(frozen=True)
class Family:
    """One backend family.

    Attributes:
        name: the selector prefix (``opencl`` in ``opencl:1``).
        backend: ``"module:Class"`` of its :class:`~.base.Backend`, imported on first probe.
        label: the ``backend`` column of ``cooktop bench`` (llama-bench's; ``numpy`` for ``cpu``).
        install_hint: how to make it available (the one copy: the backend's probe reasons use it).
        reference: the numpy reference every other family is tested against (exactly one).
        driver_files: ``"module:function"`` returning the files (driver manifests, the libraries
            they name, the binding) a probe verdict depends on; ``""``: none (no driver).
        describe_drivers: ``"module:function"`` returning a one-line description of the drivers
            installed, from their files alone (for a probe child that died); ``""``: none.
        env_prefixes: environment variable prefixes that steer this family's loader and drivers
            (a changed one probes again).
        probe_modules: modules besides ``backend``'s whose code a probe verdict depends on.
        cpu_default: its CPU-type devices beat numpy, so ``auto`` takes one when no GPU passes
            its smoke test (say why where it is set).
        open_call: the driver call that opens a device, named in the probe child's steps
            (``kp.Manager``); ``""``: none worth naming.
        check_device: ``"module:function"`` the probe child calls with each device it opened:
            it raises when the device cannot be used in a process (its kernel build fails, or
            its driver crashes). A device that fails it is listed with the reason and never
            opened in the user's process (:mod:`.safeprobe`); ``""``: no check beyond opening.
        check_use: ``"module:function"`` a child process calls with one device before a process
            first opens it (:func:`.safeprobe.check_use`, verdict kept per driver set): a check too
            slow to run on every device at probe time (OpenCL: launch one real kernel, whose
            compile can abort a driver where the probe's small kernel built); ``""``: none.
        tuning: ``"module:OBJECT"`` of the family's autotuner hooks (:meth:`tuning_hooks`); ``""``: none.
    """

    name: str
    backend: str
    label: str
    install_hint: str = ""
    reference: bool = False
    driver_files: str = ""
    describe_drivers: str = ""
    env_prefixes: tuple[str, ...] = ()
    probe_modules: tuple[str, ...] = ()
    cpu_default: bool = False
    open_call: str = ""
    check_device: str = ""
    check_use: str = ""
    tuning: str = ""

    def tuning_hooks(self) -> Any:
        """The object :attr:`tuning` names (``"module:OBJECT"``): the family's side of the autotuner
        (``flavour(info)``, ``defaults(info, params)``, ``is_default(flavour, param, value)``;
        :mod:`cooktop.backends.tune.space`), or None for a family with nothing to tune."""
        return _resolve(self.tuning) if self.tuning else None

    def load_backend(self) -> Backend:
        """A new instance of the family's Backend class.

        Raises:
            ImportError (or whatever the module raises on import): the binding or driver library
            is missing or broken; the registry turns it into a probe reason with the hint.
        """
        return _resolve(self.backend)()

    def files(self) -> list[str]:
        """:attr:`driver_files`' list (``[]`` without the hook). May raise what the hook raises."""
        return list(_resolve(self.driver_files)()) if self.driver_files else []

    def drivers(self) -> str:
        """:attr:`describe_drivers`' line (``""`` without the hook). May raise what the hook raises."""
        return str(_resolve(self.describe_drivers)()) if self.describe_drivers else ""

    def check(self, device: Any) -> None:
        """Run :attr:`check_device` on an opened device (nothing without the hook).

        Raises:
            whatever the hook raises (a :class:`~cooktop.errors.DeviceError` for a failed build).
        """
        if self.check_device:
            _resolve(self.check_device)(device)

    def check_before_use(self, device: Any) -> None:
        """Run :attr:`check_use` on an opened device (nothing without the hook).

        Raises:
            whatever the hook raises (a :class:`~cooktop.errors.DeviceError` for a failed build).
        """
        if self.check_use:
            _resolve(self.check_use)(device)

    def module_files(self) -> list[str]:
        """Source files of :attr:`backend`'s module and :attr:`probe_modules` (for the verdict key)."""
        import importlib.util

        out = []
        for mod in (self.backend.partition(":")[0], *self.probe_modules):
            spec = importlib.util.find_spec(mod)
            if spec and spec.origin:
                out.append(spec.origin)
        return out

