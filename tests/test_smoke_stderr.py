"""A device whose driver writes raw diagnostics to the process's stderr during its smoke test (pip
PoCL 3.0-rc2's clang: "unknown target CPU 'generic'" for every kernel build) leaves stderr clean:
a FAIL carries the first line in its one-line detail, ``cooktop devices`` prints one note per
failing device, and a PASS keeps the text in the info log only; Python's own stderr (notices) still
shows."""

from __future__ import annotations

import logging
import os
import sys

from cooktop.backends import registry
from cooktop.errors import DeviceError

RAW = b"error: unknown target CPU 'generic'\nnote: valid target CPU values are: nocona, core2, ...\n" * 3


def _fake_open(monkeypatch, fail: bool) -> None:
    """registry.open_device writes RAW to fd 2, then fails or opens numpy; a fresh smoke cache."""
    real = registry.open_device

    def open_device(sel):
        os.write(2, RAW)  # as a C library does: past sys.stderr
        sys.stderr.write("cooktop: compiling OpenCL kernels for fake (first run only)\n")  # a notice
        if fail:
            raise DeviceError("OpenCL build of the weight kernels failed on fake")
        return real("cpu")

    monkeypatch.setattr(registry, "_smoke", {})
    monkeypatch.setattr(registry, "open_device", open_device)


def test_failing_driver_output_becomes_one_note(monkeypatch, capfd):
    _fake_open(monkeypatch, True)
    res = registry.smoke_test("fake:0")
    err = capfd.readouterr().err
    assert not res.ok
    assert "unknown target CPU" not in err, err
    assert err == "cooktop: compiling OpenCL kernels for fake (first run only)\n"  # notices still show
    assert res.detail == ("DeviceError: OpenCL build of the weight kernels failed on fake "
                          "(driver: error: unknown target CPU 'generic')")
    assert "\n" not in res.detail


def test_passing_device_output_goes_to_the_info_log(monkeypatch, capfd, caplog):
    _fake_open(monkeypatch, False)
    with caplog.at_level(logging.INFO, logger="cooktop"):
        res = registry.smoke_test("fake:1")
    err = capfd.readouterr().err
    assert res.ok, res.detail
    assert "unknown target CPU" not in err, err
    assert any("unknown target CPU 'generic'" in r.getMessage() and "fake:1" in r.getMessage()
               for r in caplog.records)
    # fd 2 is back: a later write reaches it
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
