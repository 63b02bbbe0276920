# CMake toolchain file: build Kompute's Python package (kp 0.9.0) from its PyPI
# sdist without network access. kp's CMake would download Vulkan-Headers, fmt
# and pybind11 with FetchContent; use the system's packages instead
# (Debian/Ubuntu: libvulkan-dev, libfmt-dev, pybind11-dev).
# CMake >= 3.21 reads this file from the CMAKE_TOOLCHAIN_FILE environment
# variable, so kp's setup.py needs no change. Used by scripts/install-kompute.sh.
set(KOMPUTE_OPT_USE_BUILT_IN_VULKAN_HEADER OFF CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_USE_BUILT_IN_FMT OFF CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_USE_BUILT_IN_PYBIND11 OFF CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK ON CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_INSTALL OFF CACHE BOOL "" FORCE)
set(FETCHCONTENT_FULLY_DISCONNECTED ON CACHE BOOL "" FORCE)
# kp's setup.py drops -DPYTHON_EXECUTABLE (a missing comma in its cmake_args),
# so name the interpreter here; install-kompute.sh sets KP_PYTHON.
if(DEFINED ENV{KP_PYTHON})
  set(PYTHON_EXECUTABLE "$ENV{KP_PYTHON}" CACHE FILEPATH "" FORCE)
endif()
