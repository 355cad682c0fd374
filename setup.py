"""Builds fp8ext's native parts with CMake (see CMakeLists.txt).

Environment knobs:
  FP8EXT_CUDA        AUTO (default), 1 or 0: build the CUDA kernels
  FP8EXT_CUDA_ARCHS  CUDA architectures, default "90a"
  CUTLASS_DIR        CUTLASS source root; default: the nvidia-cutlass package's headers
  CUDA_HOME          CUDA toolkit root; default /usr/local/cuda when it exists
  FP8EXT_BUILD_DIR   CMake build folder (kept, so ctest can run on the same build)
  MAX_JOBS           parallel compile jobs
"""
import importlib.util
import os
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def cutlass_dir():
    """CUTLASS headers: $CUTLASS_DIR, else the nvidia-cutlass wheel's copy, else None."""
    if os.environ.get("CUTLASS_DIR"):
        return os.environ["CUTLASS_DIR"]
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = os.path.join(list(spec.submodule_search_locations)[0], "source")
    return source if os.path.isdir(os.path.join(source, "include", "cutlass")) else None


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch

        ext_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        tag = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__.split('+')[0]}"
        build_dir = os.environ.get("FP8EXT_BUILD_DIR") or os.path.join(ROOT, "build", f"cmake-{tag}")
        cuda = os.environ.get("FP8EXT_CUDA", "AUTO")
        if torch.version.cuda is None and cuda.upper() == "AUTO":
            print("fp8ext: torch is a CPU-only build: building without CUDA kernels")
            cuda = "0"
        args = [
            f"-DFP8EXT_CUDA={cuda}",
            f"-DFP8EXT_CUDA_ARCHS={os.environ.get('FP8EXT_CUDA_ARCHS', '90a')}",
            f"-DFP8EXT_TORCH_DIR={os.path.dirname(torch.__file__)}",
            f"-DFP8EXT_TORCH_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
            f"-DFP8EXT_EXTENSION_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={ext_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        cuda_home = os.environ.get("CUDA_HOME") or ("/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None)
        if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
            # The real nvcc, not a wrapper on PATH, so CMake finds the toolkit's libraries.
            args.append(f"-DCMAKE_CUDA_COMPILER={os.path.join(cuda_home, 'bin', 'nvcc')}")
        cutlass = cutlass_dir()
        if cutlass:
            args.append(f"-DFP8EXT_CUTLASS_DIR={cutlass}")
        try:
            import ninja  # noqa: F401

            args.append("-GNinja")
        except ImportError:
            pass
        # Prefer the cmake installed beside this Python (pip's cmake) over the system one.
        local_cmake = os.path.join(os.path.dirname(sys.executable), "cmake")
        cmake = local_cmake if os.path.exists(local_cmake) else "cmake"
        os.makedirs(build_dir, exist_ok=True)
        if os.path.exists(os.path.join(build_dir, "CMakeCache.txt")) and "-GNinja" in args:
            args.remove("-GNinja")  # generator is fixed at first configure
        subprocess.check_call([cmake, "-S", ROOT, "-B", build_dir, *args])
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 2)
        subprocess.check_call([cmake, "--build", build_dir, "-j", jobs])


setup(ext_modules=[CMakeExtension("fp8ext._C")], cmdclass={"build_ext": CMakeBuild})
