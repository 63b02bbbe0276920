"""The OpenCL backend (pyopencl): any OpenCL 1.2+ driver (PoCL on CPUs, Mesa rusticl, Intel, AMD, Adreno).

- ``device.py``: probe (platforms), :class:`~.device.OpenCLDevice` (buffers, ops).
- ``info.py``: the DeviceInfo of a pyopencl device, its kernel variants, the ICD files.
- ``programs.py``: program sources, build options and cache, launch shapes (CPU / GPU).
- ``q8.py``: the 8-bit copies of activations the integer-dot matmuls read.
- ``kernels/*.cl``: the OpenCL C kernels, one file per op family.
"""

from ..family import Family

INSTALL_HINT = ("pip install 'cooktop[opencl]' and an OpenCL driver (Debian/Ubuntu: apt-get install "
                "pocl-opencl-icd for CPUs, mesa-opencl-icd / intel-opencl-icd / rocm-opencl-runtime for GPUs)")

#: ``check_device``: a driver can list a device and still fail every kernel build (PyPI's PoCL
#: 3.0-rc2 on some AMD CPUs: "unknown target CPU 'generic'"), and then abort the process at exit
#: ("still have references to IRs - can't release LLVM context"); on others it builds a small
#: kernel and aborts in LLVM's instruction selection on ``rmsnorm_q8`` ("Cannot select", SIGABRT).
#: The probe child builds and runs one small kernel on each device, so such a device is listed
#: unusable and never built on here; ``check_use``: before a process first opens a device, a child
#: launches one real kernel (rmsnorm) on it, where PoCL 3.0-rc2 aborts on an AMD EPYC VM.
#: ``cpu_default``: measured on the 2-core dev machine (README "Benchmarks"), OpenCL on PoCL runs
#: the 1.1B Q4_0 shape 2.3x (tg) and 2.6x (pp) faster than numpy and ties on stories260K, so
#: ``auto`` prefers PoCL to numpy when no GPU passes; Vulkan on lavapipe is 10-50x slower than
#: numpy and never is.
FAMILY = Family("opencl", "cooktop.backends.opencl.device:OpenCLBackend", "opencl", INSTALL_HINT,
                driver_files="cooktop.backends.opencl.info:driver_files",
                describe_drivers="cooktop.backends.opencl.info:describe_icds",
                env_prefixes=("OCL_", "OPENCL_", "POCL_", "PYOPENCL_", "RUSTICL_", "COOKTOP_OPENCL"),
                cpu_default=True, probe_modules=("cooktop.backends.opencl.info",),
                check_device="cooktop.backends.opencl.device:check_build",
                check_use="cooktop.backends.opencl.device:check_kernel",
                tuning="cooktop.backends.opencl.tuning:TUNING")
