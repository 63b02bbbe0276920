"""The Vulkan backend through Kompute (``kp`` 0.9.0 with cooktop's patch): any Vulkan 1.1 driver.

- ``device.py``: probe, :class:`~.device.VulkanDevice` (tensors, ops recorded into sequences).
- ``info.py``: device facts through libvulkan (limits, features, subgroups, memory).
- ``icd.py``: the driver (ICD) manifests the loader would read, from the files alone.
- ``graph.py``: sequence recording, barriers, graphs replayed by key.
- ``shaders.py``: shader variants (``variants.json``), SPIR-V, push constants, grid sizes.
- ``q8.py``: the 8-bit activation copies of the integer-dot mat-vec.
- ``build.py``: compiles ``glsl/*.comp`` to ``spv/*.spv`` (``make shaders``).
"""

from ..family import Family

INSTALL_HINT = ("build kp 0.9.0 with cooktop's patch: cooktop setup-vulkan (needs cmake "
                "g++ libvulkan-dev libfmt-dev, pybind11>=2.12 from PyPI), and a Vulkan driver (apt-get install "
                "mesa-vulkan-drivers for lavapipe on the CPU)")

FAMILY = Family("vulkan", "cooktop.backends.vulkan.device:VulkanBackend", "vulkan", INSTALL_HINT,
                driver_files="cooktop.backends.vulkan.icd:driver_files",
                describe_drivers="cooktop.backends.vulkan.icd:describe_icds",
                env_prefixes=("VK_", "MESA_", "LP_", "GALLIUM_", "COOKTOP_VULKAN"), open_call="kp.Manager",
                probe_modules=("cooktop.backends.vulkan.info", "cooktop.backends.vulkan.icd"),
                tuning="cooktop.backends.vulkan.tuning:TUNING")
