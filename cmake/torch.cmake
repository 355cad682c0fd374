# Locates torch's headers and libraries from the installed package folder
# (FP8EXT_TORCH_DIR, from setup.py: torch.utils.cmake_prefix_path/../..) without
# TorchConfig.cmake, which insists on a CUDA toolkit whenever torch was built
# with CUDA and so would break the CPU-only build.
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

set(_torch_libs c10 torch torch_cpu)
if(FP8EXT_WITH_CUDA)
  list(APPEND _torch_libs c10_cuda torch_cuda)
endif()
add_library(fp8ext_torch INTERFACE)
target_include_directories(fp8ext_torch SYSTEM INTERFACE
  "${FP8EXT_TORCH_DIR}/include" "${FP8EXT_TORCH_DIR}/include/torch/csrc/api/include")
foreach(lib IN LISTS _torch_libs)
  find_library(FP8EXT_TORCH_LIB_${lib} NAMES ${lib} PATHS "${FP8EXT_TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(fp8ext_torch INTERFACE "${FP8EXT_TORCH_LIB_${lib}}")
endforeach()
if(DEFINED FP8EXT_TORCH_CXX11_ABI)
  target_compile_definitions(fp8ext_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${FP8EXT_TORCH_CXX11_ABI})
endif()
if(FP8EXT_WITH_CUDA)
  target_link_libraries(fp8ext_torch INTERFACE CUDA::cudart)
endif()
