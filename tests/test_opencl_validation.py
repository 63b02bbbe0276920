"""The Oclgrind harness itself (tests/opencl_validation.py): it sees a real race, maps a report back
to its kernel file and line, and counts nothing on clean output, so ``make
test-opencl-validation`` passing means something."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import opencl_validation as ov
from conftest import ROOT, skip_or_fail

from cooktop.backends.opencl.programs import PROGRAMS, read_source


def _ops_line(needle: str) -> int:
    """The line of the ops program (its files concatenated) that holds ``needle`` in quant.cl."""
    lines = read_source(*PROGRAMS["ops"]).splitlines()
    start = read_source(*PROGRAMS["ops"][:PROGRAMS["ops"].index("quant.cl")]).count("\n") + 2
    return next(i for i in range(start, len(lines) + 1) if needle in lines[i - 1])


#: quant.cl's sum loop in rmsnorm_q8, as a line of the ops program (it moves when a file before it grows).
LINE = _ops_line("vload16(i, x + off)")

#: A report as Oclgrind 21.10 writes it (the rmsnorm_q8 race it found before the global fence).
SAMPLE = f"""=== cooktop-opencl-validation: test tests/test_x.py::test_norm
Read-write data race at global memory address 0x4a000000000040
\tKernel: rmsnorm_q8
\t
\tFirst entity:  Global(1,0,0) Local(1,0,0) Group(0,0,0)
\t  %call5 = tail call spir_func <16 x float> @_Z7vload16mPU3AS1Kf(i64 noundef %conv4)
\tAt line {LINE} (column 27) of input.cl:
\t  (source not available)
\t
\tSecond entity: Global(0,0,0) Local(0,0,0) Group(0,0,0)
\tAt line 194 (column 9) of input.cl:
=== cooktop-opencl-validation: test tests/test_x.py::test_clean
=== cooktop-opencl-validation: device opencl:0 Oclgrind Simulator (gpu)
"""


def test_parse_and_locate():
    reports = ov.parse_log(SAMPLE)
    assert len(reports) == 1
    r = reports[0]
    assert r.kind.startswith("Read-write data race") and r.kernel == "rmsnorm_q8" and r.line == LINE
    assert r.test == "tests/test_x.py::test_norm"
    # line LINE of the ops program (norm.cl + rope.cl + elementwise.cl + quant.cl) is quant.cl's sum loop
    assert ov.where(r).startswith("rmsnorm_q8 at quant.cl:")
    line = int(ov.where(r).rsplit(":", 1)[1])
    src = (ROOT / "cooktop/backends/opencl/kernels/quant.cl").read_text().splitlines()[line - 1]
    assert "vload16(i, x + off)" in src
    assert ov.parse_log("=== cooktop-opencl-validation: test a\n") == []


RACY = textwrap.dedent("""
    import numpy as np, pyopencl as cl
    ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, '''
        __kernel void racy(global float *a) {
            // every work-item reads its right neighbour, which that neighbour overwrites: no barrier
            const int i = get_global_id(0);
            a[i] = a[(i + 1) % get_global_size(0)] + 1.0f;
        }''').build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(64, np.float32))
    prg.racy(q, (64,), (64,), buf)
    q.finish()
    print(cl.get_platforms()[0].get_devices()[0].name)
""")


def test_oclgrind_reports_a_race(tmp_path):
    """Under the harness' environment a racy kernel is reported by kernel name, and the ICD of
    our own folder is the only driver the loader sees."""
    lib = ov.find_icd_library()
    if lib is None:
        skip_or_fail(ov.RESOURCE, "Oclgrind is not installed (apt-get install oclgrind)")
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "oclgrind.icd").write_text(lib + "\n")
    log = tmp_path / "oclgrind.log"
    env = {**os.environ, "OCL_ICD_VENDORS": str(vendors), "OCLGRIND_DATA_RACES": "1", "OCLGRIND_LOG": str(log),
           "PYOPENCL_NO_CACHE": "1"}
    r = subprocess.run([sys.executable, "-c", RACY], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Oclgrind" in r.stdout
    reports = ov.parse_log(log.read_text())
    assert reports and all(x.kernel == "racy" for x in reports)
    assert any("data race" in x.kind for x in reports)
