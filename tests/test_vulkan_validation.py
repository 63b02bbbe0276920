"""The validation-layer check itself (tests/vulkan_validation.py): its log parser, its
missing-layer behaviour, and that the layer with synchronization validation really reports
the hazards of dispatches recorded without barriers (and none with cooktop's barriers)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import vulkan_validation as vv
from conftest import ROOT, skip_or_fail

# Two messages as Debian's layer 1.3.239 logs them (LOG_MSG), with the check's markers.
SAMPLE = f"""\
{vv.MARKER} test tests/test_a.py::test_one
SYNC-HAZARD-READ-AFTER-WRITE(ERROR / SPEC): msgNum: -455515022 - Validation Error: [ SYNC-HAZARD-READ-AFTER-WRITE ] \
Object 0: handle = 0x20000000002, type = VK_OBJECT_TYPE_BUFFER; | MessageID = 0xe4d96472 | vkCmdDispatch: Hazard \
READ_AFTER_WRITE for VkBuffer 0x20000000002[]
    Objects: 1
        [0] 0x20000000002, type: 9, name: NULL
{vv.MARKER} test tests/test_a.py::test_two
VUID-vkCmdCopyBuffer-dstBuffer-00120(ERROR / SPEC): msgNum: 1355715885 - Validation Error: [ \
VUID-vkCmdCopyBuffer-dstBuffer-00120 ] Invalid usage flag for VkBuffer 0x270000000027[]
    Objects: 2
UNASSIGNED-BestPractices-vkCreateDevice(WARNING / PERF): msgNum: 1 - a warning
{vv.MARKER} layer loaded
"""


def test_parse_log_attributes_messages_to_tests():
    msgs = vv.parse_log(SAMPLE)
    assert [(m.id, m.severity, m.test) for m in msgs] == [
        ("SYNC-HAZARD-READ-AFTER-WRITE", "ERROR", "tests/test_a.py::test_one"),
        ("VUID-vkCmdCopyBuffer-dstBuffer-00120", "ERROR", "tests/test_a.py::test_two"),
        ("UNASSIGNED-BestPractices-vkCreateDevice", "WARNING", "tests/test_a.py::test_two")]
    assert "Objects: 1" in msgs[0].text and "test_two" not in msgs[0].text
    newer = vv.parse_log("Validation Error: [ VUID-x-00001 ] Object 0: ...\n")
    assert [(m.id, m.severity) for m in newer] == [("VUID-x-00001", "ERROR")]


def test_report_counts_errors(capsys):
    assert vv.report(vv.parse_log(SAMPLE)) == 2
    out = capsys.readouterr().out
    assert "2 error message(s), 1 other(s)" in out
    assert "SYNC-HAZARD-READ-AFTER-WRITE   in tests/test_a.py::test_one x1" in out


@pytest.mark.parametrize("require", ["", "shared,vulkan_validation"])
def test_missing_layer_skips_or_fails(monkeypatch, capsys, require):
    monkeypatch.setattr(vv, "layer_available", lambda: (False, "no layer here"))
    monkeypatch.setenv("COOKTOP_REQUIRE", require)
    rc = vv.main([])
    out = capsys.readouterr()
    if require:
        assert rc == 1 and "required resource 'vulkan_validation' missing" in out.err
    else:
        assert rc == 0 and "skipped: no layer here" in out.out


_HAZARD = textwrap.dedent("""
    import sys
    import numpy as np
    from cooktop.backends import registry
    dev = registry.open_device("vulkan:0")
    if sys.argv[1] == "off":
        dev._barrier = lambda *a, **k: None  # record no barrier at all
    a, b = dev.empty((1, 64)), dev.empty((1, 64))
    dev.write(a, np.ones((1, 64), np.float32))
    dev.add(b, a, a)      # reads a after the copy wrote it
    dev.add(a, b, b)      # reads b (written), overwrites a (read)
    assert (dev.read(a) == 4).all()
""")


@pytest.mark.parametrize("barriers", ["on", "off"])
def test_layer_reports_missing_barriers(tmp_path, barriers):
    """Under the layer with synchronization validation, dispatches without barriers give
    SYNC-HAZARD errors and the same work with cooktop's barriers gives none."""
    ok, why = vv.layer_available()
    if not ok:
        skip_or_fail(vv.RESOURCE, why)
    log = tmp_path / "layer.log"
    (tmp_path / "vk_layer_settings.txt").write_text(vv.settings_text(str(log)))
    env = dict(os.environ, VK_INSTANCE_LAYERS=vv.LAYER, VK_LAYER_SETTINGS_PATH=str(tmp_path / "vk_layer_settings.txt"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("COOKTOP_VULKAN_VALIDATION_FIFO", None)
    r = subprocess.run([sys.executable, "-c", _HAZARD, barriers], env=env, capture_output=True, text=True, check=False,
                       timeout=300)
    if "unavailable" in r.stderr:
        skip_or_fail("vulkan", r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr
    ids = [m.id for m in vv.parse_log(log.read_text()) if m.severity == "ERROR"]
    if barriers == "on":
        assert ids == []
    else:
        assert "SYNC-HAZARD-READ-AFTER-WRITE" in ids and "SYNC-HAZARD-WRITE-AFTER-READ" in ids, ids
