"""Compile cooktop's Vulkan compute shaders (GLSL) to SPIR-V with glslc.

The variants are listed in ``variants.json`` beside this module: each has a
``name`` (the ``.spv`` file name, systematic like ggml's: ``mul_mat_vec_q4_0``),
a ``source`` (``.comp`` file in ``glsl/``) and ``defines`` (passed as ``-DNAME=VALUE``).
Every variant is compiled with the same flags (:data:`FLAGS`), so the output is
deterministic for a given glslc; the glslc version is recorded in the
manifest, and so are each variant's ``digest`` (sha256 of the flags, its
defines, its ``.comp`` and every ``.glsl`` include: :func:`source_digest`) and
``spv_sha256`` (of the ``.spv`` built from them). ``tests/test_vulkan.py``
checks both without a compiler (a source edited without ``make shaders``, or a
``.spv`` changed by hand, fails); ``make shaders-check`` (``--check``)
recompiles every variant and compares the bytes (about 50 s on 2 cores).

Each variant's ``access`` is recorded too: per descriptor binding, ``"r"``
(``readonly buffer``), ``"w"`` (``writeonly``) or ``"rw"``, read from the
preprocessed source (``glslc -E`` with the variant's defines). The Vulkan
backend records a memory barrier before a dispatch that reads or writes a
buffer an earlier dispatch of the same command buffer wrote, or writes one it
read (``device.py``, ``_record``); these flags say which is which.
The device ``features`` a variant needs (Vulkan feature names, e.g.
``storageBuffer16BitAccess``) are read from its SPIR-V's ``OpCapability``
instructions (:data:`FEATURE_OF_CAPABILITY`). A variant with
``"variant_of": NAME`` stands in for variant NAME (which needs no optional
feature) on devices where kp enabled all its features
(``shaders.py``, ``pick_variant``).

Usage::

    python -m cooktop.backends.vulkan.build            # (re)build every .spv into spv/
    python -m cooktop.backends.vulkan.build --check    # exit 1 if any .spv is stale
    python -m cooktop.backends.vulkan.build --list     # print the variants
    python -m cooktop.backends.vulkan.build --init     # rewrite variants.json from default_variants()

``make shaders`` runs the first form. glslc comes from the shaderc project
(Debian/Ubuntu: ``apt-get install glslc``; also in the Vulkan SDK).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
#: GLSL sources (``.comp`` and included ``.glsl``) and the compiled SPIR-V (shipped in the package).
GLSL_DIR = HERE / "glsl"
SPV_DIR = HERE / "spv"
MANIFEST = HERE / "variants.json"

#: glslc flags used for every variant (Vulkan 1.1 is what kp 0.9.0 creates its instance with).
FLAGS = ["-fshader-stage=compute", "--target-env=vulkan1.1", "-O"]

#: Weight types with shader variants, and the op families that take a weight type.
TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "MXFP4",
         "Q2_K", "Q3_K"]
TYPED = ["mul_mat_vec", "mul_mm", "get_rows", "mul_mat_id"]
PLAIN = ["rmsnorm", "rope", "kv_store", "attention", "silu_mul", "gelu_mul", "add", "add_bias", "quantize_q8_1",
         "quantize_q8_K", "copy",
         "moe_route", "add_id", "moe_combine", "swiglu_oai", "mul", "ssm_conv",
         "silu", "sigmoid_mul", "l2_norm", "gdn_gate", "gated_delta_net", "ssm_scan", "ssm_norm", "scale"]
#: Weight types with an integer-dot mat-vec on 8-bit activations (block_q8_1), those of them with
#: one on llama.cpp's block_q8_K too, and the types with 16-bit-storage loads.
INT_DOT_TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
Q8K_TYPES = ["Q4_K", "Q5_K", "Q6_K"]
PACKED16_TYPES = ["Q4_0", "Q8_0"]


def default_variants() -> list[dict]:
    """The variant list ``--init`` writes, in ``variants.json`` order: every typed op x weight type
    (with, after the mat-vec ones, the integer-dot and 16-bit-storage mat-vec variants that stand in
    for them where a device has the features; the integer-dot ones with ``"input": "q8_1"``, then
    the K-quants' with ``"input": "q8_K"``), then the float ops, the two 8-bit activation
    quantizers, copy, the mixture-of-experts ops (``mul_mat_id``
    per type among the typed ones; routing, ``add_id``, the weighted sum, ``swiglu_oai``), fill,
    attention with sinks and the rectangle copy of tensors stored in row chunks, the attention variants
    (scores, query tiles, split-K) and the vision ops (layer norm, the three GELUs, the average pool,
    the vision rope). ``access`` and
    ``features`` are filled in by :func:`build`."""
    def typed(op: str, src: str | None = None, types: list[str] = TYPES, suffix: str = "", **extra: str) -> list[dict]:
        return [{"name": f"{op}_{t.lower()}{suffix}", "source": src or f"{op}.comp",
                 "defines": {f"TYPE_{t}": "1", **extra}, **({"variant_of": f"{op}_{t.lower()}"} if suffix else {})}
                for t in types]

    out = typed("mul_mat_vec")
    # 8-bit activations (block_q8_1 input, made by quantize_q8_1), integer dot products (OpSDot)
    out += [{**v, "input": "q8_1"} for v in typed("mul_mat_vec", "mul_mat_vec_q8.comp", INT_DOT_TYPES, "_q8")]
    # the K-quants on block_q8_K (made by quantize_q8_K), the same shader built with Q8K
    out += [{**v, "input": "q8_K"} for v in typed("mul_mat_vec", "mul_mat_vec_q8.comp", Q8K_TYPES, "_q8k", Q8K="1")]
    out += typed("mul_mat_vec", None, PACKED16_TYPES, "_p16", PACKED16="1")  # 16-bit storage loads
    out += typed("mul_mm") + typed("get_rows") + typed("mul_mat_id")
    out += [{"name": op, "source": f"{op}.comp", "defines": {}} for op in PLAIN]
    out.append({"name": "fill", "source": "copy.comp", "defines": {"FILL": "1"}})
    out.append({"name": "attention_sinks", "source": "attention.comp", "defines": {"SINKS": "1"}})
    out.append({"name": "copy_rect", "source": "copy_rect.comp", "defines": {}})  # tensors in row chunks
    # attention without flash attention: scores, softmax, weighted V
    out += [{"name": f"attention_{s.lower()}", "source": "attention_kq.comp", "defines": {s: "1"}}
            for s in ("KQ", "SOFTMAX", "KQV")]
    # query-tiled flash attention for prompts
    out.append({"name": "attention_tiled", "source": "attention_tiled.comp", "defines": {}})
    out.append({"name": "attention_tiled_sinks", "source": "attention_tiled.comp", "defines": {"SINKS": "1"}})
    # split-K flash decode: partials per split of the keys, then their reduce (with sinks or not)
    out.append({"name": "attention_split", "source": "attention.comp", "defines": {"SPLIT": "1"}})
    out.append({"name": "attention_split_reduce", "source": "attention_split_reduce.comp", "defines": {}})
    out.append({"name": "attention_split_reduce_sinks", "source": "attention_split_reduce.comp",
                "defines": {"SINKS": "1"}})
    # the vision encoders' ops (attention_full runs the flash attention shaders above)
    out += [{"name": op, "source": f"{op}.comp", "defines": {}} for op in ("layer_norm", "gelu", "avg_pool2d",
                                                                        "rope_multi")]
    out += [{"name": f"gelu_{s.lower()}", "source": "gelu.comp", "defines": {f"GELU_{s}": "1"}}
            for s in ("ERF", "QUICK")]
    return out


def glslc_path() -> str | None:
    """Path of glslc, or None."""
    return shutil.which("glslc")


def glslc_version(glslc: str) -> str:
    """First line of ``glslc --version`` (e.g. ``shaderc 2023.2-1``)."""
    out = subprocess.run([glslc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].strip()


def load_manifest() -> dict:
    """The parsed variants.json: ``{"glslc": str, "flags": [...], "variants": [...]}``."""
    return json.loads(MANIFEST.read_text())


def source_digest(variant: dict) -> str:
    """sha256 (hex) of what a variant's SPIR-V is built from: :data:`FLAGS`, its ``source`` and
    ``defines``, the ``.comp`` file and every ``.glsl`` file of :data:`GLSL_DIR` (the includes, all
    of them: a change to any include changes every digest)."""
    h = hashlib.sha256(json.dumps({"flags": FLAGS, "source": variant["source"], "defines": variant["defines"]},
                                  sort_keys=True).encode())
    h.update((GLSL_DIR / variant["source"]).read_bytes())
    for p in sorted(GLSL_DIR.glob("*.glsl")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def unbuilt_variants() -> list[str]:
    """Names of variants whose sources changed since :func:`build` (``digest``), or whose shipped
    ``.spv`` is not the one it wrote (``spv_sha256``, or missing); no compiler needed."""
    out = []
    for v in load_manifest()["variants"]:
        spv = SPV_DIR / f"{v['name']}.spv"
        if (v.get("digest") != source_digest(v) or not spv.exists()
                or v.get("spv_sha256") != hashlib.sha256(spv.read_bytes()).hexdigest()):
            out.append(v["name"])
    return out


def compile_variant(glslc: str, variant: dict, out: pathlib.Path) -> None:
    """Compile one variant to ``out``.

    Raises:
        RuntimeError: glslc failed (its message included).
    """
    cmd = [glslc, *FLAGS, f"-I{GLSL_DIR}"]
    cmd += [f"-D{k}={v}" for k, v in variant["defines"].items()]
    cmd += [str(GLSL_DIR / variant["source"]), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"glslc failed on {variant['name']}: {r.stderr.strip()}")


#: SPIR-V capability -> the Vulkan device feature that allows it (SPIR-V 1.6 spec, capability
#: numbers; Vulkan spec appendix "SPIR-V Environment", capability table). Shader (1) and the
#: Vulkan 1.1 subgroup capabilities (61-68) need no feature: subgroup operations are checked by
#: the probe (VkPhysicalDeviceSubgroupProperties).
FEATURE_OF_CAPABILITY = {9: "shaderFloat16", 22: "shaderInt16", 39: "shaderInt8",
                         4433: "storageBuffer16BitAccess", 4448: "storageBuffer8BitAccess",
                         6016: "shaderIntegerDotProduct", 6017: "shaderIntegerDotProduct",
                         6018: "shaderIntegerDotProduct", 6019: "shaderIntegerDotProduct"}
_NO_FEATURE = {1} | set(range(61, 69))


def spirv_features(spv: bytes) -> list[str]:
    """Device features the SPIR-V module needs, sorted (from its OpCapability instructions).

    Raises:
        RuntimeError: not SPIR-V, or a capability this table does not know (add it above).
    """
    words = struct.unpack(f"<{len(spv) // 4}I", spv[: len(spv) // 4 * 4])
    if not words or words[0] != 0x07230203:
        raise RuntimeError("not a SPIR-V module (bad magic)")
    feats, i = set(), 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        if n == 0:
            raise RuntimeError("malformed SPIR-V (zero word count)")
        if op == 17:  # OpCapability
            cap = words[i + 1]
            if cap in FEATURE_OF_CAPABILITY:
                feats.add(FEATURE_OF_CAPABILITY[cap])
            elif cap not in _NO_FEATURE:
                raise RuntimeError(f"SPIR-V capability {cap} has no entry in FEATURE_OF_CAPABILITY")
        i += n
    return sorted(feats)


_BUFFER_DECL = re.compile(
    r"layout\s*\(([^)]*)\)\s*((?:(?:readonly|writeonly|restrict|coherent|volatile)\s+)*)buffer\b")


def binding_access(glslc: str, variant: dict) -> list[str]:
    """Access of each descriptor binding of ``variant``: ``"r"``, ``"w"`` or ``"rw"``, in binding order.

    Read from ``glslc -E`` output (the source after the variant's ``#ifdef``s).
    Raises:
        RuntimeError: glslc failed, or the bindings are not 0..n-1 (kp binds tensors in order).
    """
    cmd = [glslc, "-E", "-fshader-stage=compute", f"-I{GLSL_DIR}"]
    cmd += [f"-D{k}={v}" for k, v in variant["defines"].items()]
    cmd.append(str(GLSL_DIR / variant["source"]))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"glslc -E failed on {variant['name']}: {r.stderr.strip()}")
    access: dict[int, str] = {}
    for m in _BUFFER_DECL.finditer(r.stdout):
        b = re.search(r"binding\s*=\s*(\d+)", m.group(1))
        if b is None:
            raise RuntimeError(f"{variant['name']}: a buffer without a binding number")
        quals = m.group(2).split()
        access[int(b.group(1))] = "r" if "readonly" in quals else "w" if "writeonly" in quals else "rw"
    if sorted(access) != list(range(len(access))):
        raise RuntimeError(f"{variant['name']}: bindings {sorted(access)} are not 0..n-1")
    return [access[i] for i in range(len(access))]


def spirv_access(spv: bytes) -> list[str]:
    """Access of each descriptor binding of a SPIR-V module, as :func:`binding_access` gives it
    from the source: ``"r"`` (``NonWritable``: GLSL ``readonly``), ``"w"`` (``NonReadable``:
    ``writeonly``) or ``"rw"``, in binding order. glslang decorates the block's members (or the
    variable) with these (SPIR-V spec 3.20, Decoration; GLSL -> SPIR-V: GL_KHR_vulkan_glsl).

    Raises:
        RuntimeError: not SPIR-V, or the bindings are not 0..n-1.
    """
    words = struct.unpack(f"<{len(spv) // 4}I", spv[: len(spv) // 4 * 4])
    if not words or words[0] != 0x07230203:
        raise RuntimeError("not a SPIR-V module (bad magic)")
    binding: dict[int, int] = {}
    var_dec: dict[int, set[int]] = {}
    member_dec: dict[int, dict[int, set[int]]] = {}
    n_members: dict[int, int] = {}
    pointee: dict[int, int] = {}
    var_type: dict[int, int] = {}
    i = 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        if n == 0:
            raise RuntimeError("malformed SPIR-V (zero word count)")
        a = words[i + 1:i + n]
        if op == 71:  # OpDecorate target decoration [literal]
            if a[1] == 33:  # Binding
                binding[a[0]] = a[2]
            var_dec.setdefault(a[0], set()).add(a[1])
        elif op == 72:  # OpMemberDecorate struct member decoration
            member_dec.setdefault(a[0], {}).setdefault(a[1], set()).add(a[2])
        elif op == 30:  # OpTypeStruct result members...
            n_members[a[0]] = len(a) - 1
        elif op == 32:  # OpTypePointer result storage-class type
            pointee[a[0]] = a[2]
        elif op == 59:  # OpVariable result-type result storage-class
            var_type[a[1]] = a[0]
        i += n

    def has(var: int, deco: int) -> bool:
        struct_id = pointee.get(var_type.get(var, -1), -1)
        members = member_dec.get(struct_id, {})
        every_member = n_members.get(struct_id, 0) > 0 and all(
            deco in members.get(m, ()) for m in range(n_members[struct_id]))
        return deco in var_dec.get(var, ()) or every_member

    access = {b: "r" if has(v, 24) else "w" if has(v, 25) else "rw" for v, b in binding.items()}
    if sorted(access) != list(range(len(access))):
        raise RuntimeError(f"bindings {sorted(access)} are not 0..n-1")
    return [access[i] for i in range(len(access))]


def stale_variants(glslc: str) -> list[str]:
    """Names of variants whose shipped ``.spv`` differs from a fresh compile (or is missing),
    or whose recorded ``access`` / ``features`` differ from the fresh module's.

    One glslc run per variant (the access is read from the fresh SPIR-V, which :func:`build`
    checks against the source's qualifiers), several at a time.
    """
    variants = load_manifest()["variants"]
    with tempfile.TemporaryDirectory() as tmp:
        def fresh(v: dict) -> bytes:
            out = pathlib.Path(tmp) / f"{v['name']}.spv"
            compile_variant(glslc, v, out)
            return out.read_bytes()

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            compiled = list(pool.map(fresh, variants))
    stale = []
    for v, spv in zip(variants, compiled):
        shipped = SPV_DIR / f"{v['name']}.spv"
        if (not shipped.exists() or shipped.read_bytes() != spv
                or v.get("access") != spirv_access(spv)
                or v.get("features", []) != spirv_features(spv)):
            stale.append(v["name"])
    return stale


def build(glslc: str) -> int:
    """Compile every variant into SPV_DIR, record its binding access and the glslc version;
    returns the count."""
    manifest = load_manifest()
    for v in manifest["variants"]:
        compile_variant(glslc, v, SPV_DIR / f"{v['name']}.spv")
        v["access"] = binding_access(glslc, v)
        spv = (SPV_DIR / f"{v['name']}.spv").read_bytes()
        if spirv_access(spv) != v["access"]:  # --check reads the access from the SPIR-V
            raise RuntimeError(f"{v['name']}: the SPIR-V's bindings {spirv_access(spv)} differ from the "
                               f"source's {v['access']} (a binding optimized away?)")
        feats = spirv_features(spv)
        if feats:
            v["features"] = feats
        else:
            v.pop("features", None)
        if feats and not v.get("variant_of"):
            raise RuntimeError(f"{v['name']} needs {feats} but stands in for no feature-free variant (variant_of)")
        v["digest"] = source_digest(v)
        v["spv_sha256"] = hashlib.sha256(spv).hexdigest()
    manifest["glslc"] = glslc_version(glslc)
    manifest["flags"] = FLAGS
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return len(manifest["variants"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report stale .spv files, write nothing")
    ap.add_argument("--list", action="store_true", help="list the variants")
    ap.add_argument("--init", action="store_true", help="rewrite variants.json with the default variant list")
    args = ap.parse_args(argv)
    if args.init:
        old = {v["name"]: v for v in load_manifest()["variants"]} if MANIFEST.exists() else {}
        kept = ("access", "features", "digest", "spv_sha256")
        fresh = [{**v, **{k: old[v["name"]][k] for k in kept if k in old.get(v["name"], {})}}
                 for v in default_variants()]
        MANIFEST.write_text(json.dumps({"glslc": "", "flags": FLAGS, "variants": fresh}, indent=1) + "\n")
    if args.list:
        for v in load_manifest()["variants"]:
            print(v["name"], v["source"], " ".join(f"-D{k}={x}" for k, x in v["defines"].items()))
        return 0
    glslc = glslc_path()
    if glslc is None:
        print("error: glslc not found (apt-get install glslc, or the Vulkan SDK)", file=sys.stderr)
        return 1
    try:
        if args.check:
            stale = stale_variants(glslc)
            if stale:
                print("stale: " + " ".join(stale) + " (run: make shaders)", file=sys.stderr)
                return 1
            print("all SPIR-V up to date")
            return 0
        n = build(glslc)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"compiled {n} shader variants into {SPV_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
