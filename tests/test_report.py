"""``cooktop report``: the quick suite once on numpy + the first OpenCL device (module fixture), its
report.json against the schema, figures against the single commands that the report names (run as
recorded), an injected failing step kept in the page, --compare's ratios and its refusal of a
different suite, and the page in a headless browser (no console errors, every section, a screenshot)."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import shlex
import shutil
import time

import pytest
from click.testing import CliRunner
from conftest import ROOT, open_family_device, require_modules, skip_or_fail

from cooktop.cli.group import cli
from cooktop.cli.main import _register
from cooktop.errors import CooktopError

_register()


def _umask() -> int:
    import os
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _cli(command: str):
    """Run a recorded ``cooktop ...`` line in-process; returns click's result (exit code, output)."""
    args = shlex.split(command)
    assert args[0] == "cooktop"
    return CliRunner().invoke(cli, args[1:], catch_exceptions=False)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """(report dict, folder, OpenCL selector, seconds): ``cooktop report --quick`` on opencl + cpu, with
    the cpu's ops step made to fail (what a broken driver would do)."""
    dev = open_family_device("opencl")
    sel = dev.info.selector
    out = tmp_path_factory.mktemp("report")
    import cooktop.bench.ops as ops

    real = ops.bench_ops

    def failing(selectors, plan, tick=None, seed=0):
        if selectors == ["cpu"]:
            raise RuntimeError("injected: the cpu roofline step broke")
        return real(selectors, plan, tick, seed)

    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "bench_ops", failing)
        res = _cli(f"cooktop report --quick --no-progress --device {sel},cpu,nosuch:0 -o {out}")
    seconds = time.perf_counter() - t0
    assert res.exit_code == 0, res.output
    return json.loads((out / "report.json").read_text()), out, sel, seconds


def test_quick_report_matches_its_schema_and_time(quick):
    from cooktop.report import schema
    doc, out, sel, seconds = quick
    schema.validate(doc)
    assert seconds < 120, f"--quick took {seconds:.0f} s"
    assert doc["suite"]["level"] == "quick" and doc["suite"]["version"] >= 1
    assert [d["selector"] for d in doc["devices"] if d.get("measured")] == [sel, "cpu"] or \
        {d["selector"] for d in doc["devices"] if d.get("measured")} == {sel, "cpu"}
    assert {b["weight_type"] for b in doc["bench"]} == {"Q4_0", "Q8_0"}
    assert all(b["avg_ts"] > 0 for b in doc["bench"]), [b for b in doc["bench"] if not b["avg_ts"]]
    assert {b["test"] for b in doc["bench"]} == {"pp64", "tg16", "tg16 @ d64"}
    assert {r["device"] for r in doc["ops"]} == {sel}
    assert any(r["roofline_pct"] for r in doc["ops"] if r["op"] == "matmul")
    assert len(doc["recommendations"]) == 2 and all(r["device"] for r in doc["recommendations"])
    bad = next(d for d in doc["devices"] if d["selector"] == "nosuch:0")
    assert not bad["measured"] and "nosuch" in bad["reason"]
    with pytest.raises(CooktopError, match="schema at steps/0"):
        broken = copy.deepcopy(doc)
        del broken["steps"][0]["ok"]
        schema.validate(broken)


def test_figures_equal_the_single_commands(quick):
    doc, out, sel, _ = quick
    page = (out / "index.html").read_text()
    # KLD: the recorded kld-table command prints the same summary, and the page shows it
    for k in [k for k in doc["kld"] if k["device"] == sel][:1] + [k for k in doc["kld"] if k["device"] == "cpu"][:1]:
        res = _cli(k["command"])
        assert res.exit_code == 0, res.output
        cells = json.loads(res.stdout)
        assert cells[0]["summary"] == k["summary"]
        assert f">{k['summary']['kld']:.6f}<" in page
    # the plan: the recorded plan --json gives the same -ngl and summary
    p = next(p for p in doc["plans"] if p["device"] == sel)
    res = _cli(p["command"])
    plan = json.loads(res.stdout)
    assert (plan["n_gpu_layers"], plan["summary"]) == (p["n_gpu_layers"], p["summary"])
    # devices --json: the same device facts
    from cooktop.cli.devices import devices_report
    probed = {d["selector"]: d for e in devices_report(smoke=False)["families"].values() for d in e["devices"]}
    d = next(d for d in doc["devices"] if d["selector"] == sel)
    for key in ("name", "global_mem_bytes", "compute_units", "types", "largest_buffer_bytes"):
        assert d[key] == probed[sel][key], key
    # bench: the recorded command measures the same test (timings: within a factor 3)
    b = next(b for b in doc["bench"] if b["device"] == "cpu" and b["test"] == "tg16")
    res = _cli(b["command"])
    rec = json.loads(res.stdout)[0]
    assert (rec["n_prompt"], rec["n_gen"], rec["n_depth"], rec["reps"]) == (0, 16, 0, 2)
    assert 1 / 3 < rec["avg_ts"] / b["avg_ts"] < 3
    assert re.search(r'data-figure="bench"[^>]*data-test="tg16">' + re.escape(f"{b['avg_ts']:.4g}") + "<", page)


def test_failing_step_is_in_the_page(quick):
    doc, out, sel, _ = quick
    failed = [s for s in doc["steps"] if not s["ok"]]
    assert [(s["step"], s["device"]) for s in failed] == [("ops", "cpu")]
    assert "injected: the cpu roofline step broke" in failed[0]["error"]
    page = (out / "index.html").read_text()
    cpu = page[page.index('id="device-cpu"'):]
    assert "step <b>ops</b> failed: RuntimeError: injected: the cpu roofline step broke" in cpu
    assert page.count("<svg") >= 3 and not re.search(r"""(src|href)=["']?(https?:)?//|<script|<link""", page)


def test_compare_ratios_and_refusal(quick, tmp_path):
    doc, out, sel, _ = quick
    other = copy.deepcopy(doc)
    other["environment"]["COOKTOP_DEVICE_MEMORY"] = f"{sel}=512M"
    q8 = next(m for m in other["models"] if m["weight_type"] == "Q8_0")
    q8["name"] = "another-Q8_0.gguf"  # another file of that type: a difference, not a silent match
    for b in other["bench"]:
        b["avg_ts"] = b["avg_ts"] / 2
    a, b_ = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b_.mkdir()
    (a / "report.json").write_text(json.dumps(doc))
    (b_ / "report.json").write_text(json.dumps(other))
    res = _cli(f"cooktop report --compare {a}/report.json {b_}/report.json -o {tmp_path}/cmp")
    assert res.exit_code == 0, res.output
    assert "differs: env COOKTOP_DEVICE_MEMORY: - | " + f"{sel}=512M" in res.output
    from cooktop.report.compare import compare
    rows = [r for r in compare([f"{a}/report.json", f"{b_}/report.json"])["rows"] if r["figure"] == "bench t/s"]
    assert rows and all(r["ratios"][1] == pytest.approx(0.5) for r in rows)
    assert "COOKTOP_DEVICE_MEMORY" in (tmp_path / "cmp" / "index.html").read_text()
    assert "differs: model Q8_0: synth-v1-quick-Q8_0.gguf (" in res.output
    assert "another-Q8_0.gguf (" in res.output and "differs: model Q4_0" not in res.output
    # two models of one weight type in a report stay two rows, labelled by file name
    two = copy.deepcopy(doc)
    q4 = next(m for m in two["models"] if m["weight_type"] == "Q4_0")
    twin = {**q4, "path": q4["path"] + ".twin", "name": "twin.gguf"}
    two["models"].append(twin)
    two["bench"] += [{**b, "model": twin["path"], "avg_ts": 1.0} for b in doc["bench"] if b["model"] == q4["path"]]
    from cooktop.report.compare import _figures
    figs = _figures(two)
    assert figs[("bench t/s", "cpu", "twin.gguf Q4_0", "tg16")] == 1.0
    assert figs[("bench t/s", "cpu", f"{q4['name']} Q4_0", "tg16")] > 1.0
    other["suite"]["version"] += 1
    (b_ / "report.json").write_text(json.dumps(other))
    res = CliRunner().invoke(cli, ["report", "--compare", f"{a}/report.json", f"{b_}/report.json"])
    v = doc["suite"]["version"]
    assert res.exit_code == 1
    assert f"error: cannot compare: suite version {v} (a) vs {v + 1} (b)" in res.output, res.output
    other["suite"]["version"] -= 1
    other["suite"]["reps"] = 5
    (b_ / "report.json").write_text(json.dumps(other))
    res = CliRunner().invoke(cli, ["report", "--compare", f"{a}/report.json", f"{b_}/report.json"])
    assert res.exit_code == 1 and "error: cannot compare: the suites differ (a vs b): reps 2 vs 5" in res.output


def test_compare_of_a_second_report_made_with_other_settings(quick, tmp_path):
    """A second quick report, made in its own process on numpy alone with a simulated small device
    (``COOKTOP_DEVICE_MEMORY``) and one BLAS thread, lines up with the fixture's: the differences name
    both settings, numpy's figures get ratios, the OpenCL device's (absent from the second) none."""
    import os
    import subprocess
    import sys

    doc, out, sel, _ = quick
    b_dir = tmp_path / "one-thread"
    env = {**os.environ, "COOKTOP_DEVICE_MEMORY": "cpu=64MiB/16MiB", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    # relative -o and --work-dir, as the README's example gives them
    proc = subprocess.run([sys.executable, "-m", "cooktop", "report", "--quick", "--no-progress", "--device", "cpu",
                           "--work-dir", os.path.relpath(out, tmp_path), "-o", b_dir.name], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    other = json.loads((b_dir / "report.json").read_text())
    assert other["environment"]["COOKTOP_DEVICE_MEMORY"] == "cpu=64MiB/16MiB"
    assert all(s["ok"] for s in other["steps"]), [s for s in other["steps"] if not s["ok"]]
    a_dir = tmp_path / "fixture"
    a_dir.mkdir()
    (a_dir / "report.json").write_text(json.dumps(doc))
    res = _cli(f"cooktop report --compare {a_dir}/report.json {b_dir}/report.json -o {tmp_path}/cmp")
    assert res.exit_code == 0, res.output
    from cooktop.report.compare import compare
    cmp = compare([f"{a_dir}/report.json", f"{b_dir}/report.json"])
    diffs = {d["what"]: d["values"] for d in cmp["differences"]}
    assert diffs["env COOKTOP_DEVICE_MEMORY"][1] == "cpu=64MiB/16MiB", diffs
    assert diffs["env OPENBLAS_NUM_THREADS"][1] == "1", diffs
    for what in ("env COOKTOP_DEVICE_MEMORY", "env OPENBLAS_NUM_THREADS"):
        assert f"differs: {what}: " in res.output
    cpu_rows = [r for r in cmp["rows"] if r["device"] == "cpu" and r["figure"] == "bench t/s"]
    assert len(cpu_rows) == 6 and all(r["ratios"][1] and r["ratios"][1] > 0 for r in cpu_rows), cpu_rows
    for r in cpu_rows:  # each ratio is the two reports' own figures
        mine = next(b["avg_ts"] for b in other["bench"] if b["device"] == "cpu" and b["test"] == r["test"]
                    and b["weight_type"] == r["item"])
        assert r["ratios"][1] == pytest.approx(mine / r["values"][0])
    gone = [r for r in cmp["rows"] if r["device"] == sel]
    assert gone and all(r["ratios"][1] is None for r in gone)
    assert "OPENBLAS_NUM_THREADS" in (tmp_path / "cmp" / "index.html").read_text()


def test_bad_invocations_are_refused_before_measuring(quick, tmp_path, monkeypatch):
    """Each gives one clear error and measures nothing: --quick with --full, --compare with measuring
    flags or into a compared report's folder, an empty --device, a -m file that is no GGUF, an -o
    folder that cannot be written; a write that fails leaves the earlier report whole."""
    doc, out, sel, _ = quick
    (tmp_path / "link").symlink_to(out)
    page_before = (out / "index.html").read_bytes()
    assert (out / "index.html").stat().st_mode & 0o777 == 0o666 & ~_umask()
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a model")
    cases = [
        (f"report --quick --full -o {tmp_path}/x", "--quick and --full exclude each other"),
        (f"report --compare {out}/report.json {out}/report.json --device cpu", "--device does not apply"),
        (f"report --compare {out}/report.json {out}/report.json -o {out}", "holds"),
        (f"report --compare {tmp_path}/link/report.json {out}/report.json -o {out}", "holds"),
        (f"report --quick --device nosuch:0 -o {out}", "nothing written to"),
        (f"report --quick --device , -o {tmp_path}/x", "--device is empty"),
        (f"report --quick -m {text} -o {tmp_path}/x", f"-m {text}: "),
        ("report --quick --device cpu -o /proc/self", "-o /proc/self: cannot make or write the folder"),
    ]
    for args, msg in cases:
        res = CliRunner().invoke(cli, args.split())
        assert res.exit_code in (1, 2) and msg in res.output, (args, res.output)
        assert "Traceback" not in res.output
    assert not (tmp_path / "x").exists()
    assert (out / "index.html").read_bytes() == page_before
    # a page that fails to render leaves the folder's earlier report.json and index.html as they were
    from cooktop.cli import report as report_cli
    from cooktop.report import page
    keep = tmp_path / "keep"
    shutil.copytree(out, keep, ignore=shutil.ignore_patterns("models", "kld"))
    before = {n: (keep / n).read_bytes() for n in ("report.json", "index.html")}

    def broken(d):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(page, "render", broken)
    with pytest.raises(CooktopError, match="cannot write the report: No space left"):
        report_cli.write_report(doc, str(keep))
    assert {n: (keep / n).read_bytes() for n in before} == before
    assert sorted(p.name for p in keep.iterdir()) == sorted(before)


def test_page_in_a_browser(quick):
    doc, out, sel, _ = quick
    require_modules("browser", "selenium")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chrome or not driver_bin:
        skip_or_fail("browser", "chromium / chromedriver not found; apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver_bin), options=opts)
    try:
        d.get((out / "index.html").as_uri())
        for sid in ("summary", "recommendations", "plots", "devices", "models", "steps",
                    "device-" + re.sub(r"[^0-9A-Za-z]", "-", sel), "device-cpu"):
            assert d.find_element(By.ID, sid).is_displayed(), sid
        assert len(d.find_elements(By.CSS_SELECTOR, "#plots svg")) == 3
        assert len(d.find_elements(By.CSS_SELECTOR, "section.device")) == 2
        shot = ROOT / "tests" / "artifacts" / "report.png"
        shot.parent.mkdir(exist_ok=True)
        assert d.save_screenshot(str(shot)) and pathlib.Path(shot).stat().st_size > 1000
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors
    finally:
        d.quit()
