# CMake toolchain file: build Kompute's Python package (kp 0.9.0, with
# cooktop's patch) from its PyPI sdist without network access. kp's CMake
# would download Vulkan-Headers, fmt and pybind11 with FetchContent; use
# installed ones instead (Debian/Ubuntu: libvulkan-dev, libfmt-dev; pybind11
# from PyPI, >= 2.12 for numpy 2). CMake >= 3.21 reads this file from the
# CMAKE_TOOLCHAIN_FILE environment variable, so kp's setup.py needs no change.
# Used by install-kompute.sh (beside it; `cooktop setup-vulkan`), which sets the KP_* variables below.
set(KOMPUTE_OPT_USE_BUILT_IN_VULKAN_HEADER OFF CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_USE_BUILT_IN_FMT OFF CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_USE_BUILT_IN_PYBIND11 OFF CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK ON CACHE BOOL "" FORCE)
set(KOMPUTE_OPT_INSTALL OFF CACHE BOOL "" FORCE)
# Without this, kp enables VK_LAYER_KHRONOS_validation in every kp.Manager
# whenever the layer is installed (its debug builds' default): the layer is
# turned on explicitly instead (VK_INSTANCE_LAYERS, tests/vulkan_validation.py).
set(KOMPUTE_OPT_DISABLE_VK_DEBUG_LAYERS ON CACHE BOOL "" FORCE)
set(FETCHCONTENT_FULLY_DISCONNECTED ON CACHE BOOL "" FORCE)
# kp's setup.py drops -DPYTHON_EXECUTABLE (a missing comma in its cmake_args),
# so name the interpreter here.
if(DEFINED ENV{KP_PYTHON})
  set(PYTHON_EXECUTABLE "$ENV{KP_PYTHON}" CACHE FILEPATH "" FORCE)
endif()
# pybind11's CMake package (python -m pybind11 --cmakedir).
if(DEFINED ENV{KP_PYBIND11_DIR})
  set(pybind11_DIR "$ENV{KP_PYBIND11_DIR}" CACHE PATH "" FORCE)
endif()
# A prefix holding unpacked .deb files (usr/include/vulkan, usr/include/fmt,
# usr/lib/<triplet>/libvulkan.so, .../cmake/fmt): the GPU machine's build
# (scripts/gpu-check.sh), where nothing can be installed system-wide.
if(DEFINED ENV{KP_PREFIX})
  list(PREPEND CMAKE_PREFIX_PATH "$ENV{KP_PREFIX}/usr")
  set(Vulkan_INCLUDE_DIR "$ENV{KP_PREFIX}/usr/include" CACHE PATH "" FORCE)
  file(GLOB _kp_vulkan_lib "$ENV{KP_PREFIX}/usr/lib/*/libvulkan.so")
  if(_kp_vulkan_lib)
    list(GET _kp_vulkan_lib 0 _kp_vulkan_lib)
    set(Vulkan_LIBRARY "${_kp_vulkan_lib}" CACHE FILEPATH "" FORCE)
  endif()
endif()
