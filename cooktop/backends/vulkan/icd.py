"""The Vulkan loader's driver (ICD) manifests, from the files alone (no Vulkan call).

Which drivers the loader would load decides whether a probe verdict still holds
(:func:`driver_files`) and what a "no driver" error names (:func:`describe_icds`).
Search order and variables: the Vulkan loader's LoaderInterfaceArchitecture.md
("Driver Discovery on Linux").
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os

#: Environment variables that replace (first two) or extend the loader's ICD manifest search.
ICD_ENV = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_ADD_DRIVER_FILES")


def icd_search_dirs() -> list[str]:
    """Folders the Linux loader searches for ICD manifests when no ``VK_DRIVER_FILES`` /
    ``VK_ICD_FILENAMES`` is set (Vulkan-Loader docs/LoaderDriverInterface.md, "Driver
    Discovery on Linux"): XDG config dirs, /etc, XDG data dirs, each + ``vulkan/icd.d``."""
    home = os.path.expanduser("~")
    cfg = [os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")]
    cfg += (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    data = [os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")]
    data += (os.environ.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share").split(":")
    dirs = [os.path.join(d, "vulkan", "icd.d") for d in cfg if d] + ["/etc/vulkan/icd.d"]
    dirs += [os.path.join(d, "vulkan", "icd.d") for d in data if d]
    return list(dict.fromkeys(dirs))


def _manifests(spec: str) -> list[str]:
    """Manifest files a colon list of files/folders names (folders: their ``*.json``)."""
    out = []
    for item in filter(None, spec.split(os.pathsep)):
        if os.path.isdir(item):
            out += sorted(os.path.join(item, n) for n in os.listdir(item) if n.endswith(".json"))
        else:
            out.append(item)
    return out


def icd_manifests() -> tuple[str, list[str]]:
    """Where the loader looks for drivers and the manifest files it would read.

    Returns:
        (``"VK_ICD_FILENAMES=..."`` or the search folders as text, manifest paths).
    """
    override = next((v for v in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES") if os.environ.get(v)), None)
    if override:
        where, files = f"{override}={os.environ[override]}", _manifests(os.environ[override])
    else:
        dirs = icd_search_dirs()
        where = ", ".join(d for d in dirs if os.path.isdir(d)) or "the standard folders (" + ", ".join(dirs) + ")"
        files = [f for d in dirs if os.path.isdir(d) for f in _manifests(d)]
    if os.environ.get("VK_ADD_DRIVER_FILES"):
        where += f" + VK_ADD_DRIVER_FILES={os.environ['VK_ADD_DRIVER_FILES']}"
        files += _manifests(os.environ["VK_ADD_DRIVER_FILES"])
    return where, files


def manifest_library(path: str) -> tuple[str | None, str | None]:
    """``(library_path, problem)`` of one ICD manifest; ``problem`` is None when it looks usable.

    A bare library name is found by the dynamic linker and not checked here.
    """
    if not os.path.exists(path):
        return None, "does not exist"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lib = json.load(f)["ICD"]["library_path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"is not a readable ICD manifest ({type(e).__name__})"
    if not isinstance(lib, str):
        return None, "has no library_path"
    full = lib if os.path.isabs(lib) or "/" not in lib else os.path.join(os.path.dirname(path), lib)
    if "/" in full and not os.path.exists(full):
        return lib, f"names the driver library {full}, which does not exist"
    return lib, None


def driver_files() -> list[str]:
    """The ICD manifests the loader would read, the libraries they name, the implicit layers
    (they load into every instance too) and kp's extension module: what a probe verdict
    depends on (:mod:`..safeprobe`)."""
    files: list[str] = []
    _, manifests = icd_manifests()
    for m in manifests:
        files.append(m)
        lib, _problem = manifest_library(m)
        if lib and "/" in lib:
            files.append(lib if os.path.isabs(lib) else os.path.join(os.path.dirname(m), lib))
    for d in icd_search_dirs():
        files += sorted(glob.glob(os.path.join(os.path.dirname(d), "implicit_layer.d", "*.json")))
    spec = importlib.util.find_spec("kp")
    if spec and spec.origin:
        files.append(spec.origin)
    return files


def describe_icds() -> str:
    """One sentence on the Vulkan drivers installed: where the loader looks, which manifests
    it finds and what is wrong with them (no Vulkan call is made: safe in any process)."""
    where, files = icd_manifests()
    if not files:
        return f"no ICD manifest (driver) found in {where}"
    parts = []
    for p in files:
        lib, problem = manifest_library(p)
        parts.append(f"{p} {problem}" if problem else f"{os.path.basename(p)} ({lib})")
    return f"{len(files)} ICD manifest(s) in {where}: " + "; ".join(parts)
