"""Builds the wheel of the gpureclaim Python package with the native parts inside (pyproject.toml has the rest).

    pip install .                                          # builds libgpureclaim.so and the command with CMake
    pip install --no-build-isolation --no-index .          # the same, offline (Debian's setuptools and wheel)
    GPURECLAIM_BUILD_DIR=build pip install ...             # takes them from an existing CMake build instead

The package gets gpureclaim/lib/libgpureclaim.so.0 (the library, which `import gpureclaim` names as
gpureclaim.LIBRARY) and gpureclaim/bin/gpureclaim (the command, run by `python -m gpureclaim` and by the
`gpureclaim` script; it finds the library in ../lib by itself). Building needs what the C build needs: CMake,
a C compiler and the CUDA Toolkit's headers (no GPU, no driver).
"""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(HERE, "CMakeLists.txt")) as f:
        return re.search(r"project\(gpureclaim VERSION ([0-9.]+)", f.read()).group(1)


def cmake_build(build_temp):
    """The CMake build directory holding src/libgpureclaim.so.0 and tools/gpureclaim, built if need be."""
    given = os.environ.get("GPURECLAIM_BUILD_DIR")
    if given:
        return os.path.abspath(given)
    build = os.path.abspath(os.path.join(build_temp, "cmake"))
    subprocess.check_call(["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                           "-DGPURECLAIM_BUILD_TESTS=OFF", "-DGPURECLAIM_BUILD_BENCH=OFF",
                           "-DGPURECLAIM_BUILD_EXAMPLES=OFF"])
    subprocess.check_call(["cmake", "--build", build, "-j", str(os.cpu_count() or 1),
                           "--target", "gpureclaim", "gpureclaim_cmd"])
    return build


class build_py_native(build_py):
    """build_py, then the library and the command copied into the package."""

    def run(self):
        super().run()
        build = cmake_build(self.get_finalized_command("build").build_temp)
        lib = os.path.realpath(os.path.join(build, "src", "libgpureclaim.so.0"))
        cmd = os.path.join(build, "tools", "gpureclaim")
        for path in (lib, cmd):
            if not os.path.isfile(path):
                raise SystemExit("setup.py: %s was not built (GPURECLAIM_BUILD_DIR=%s)" % (path, build))
        pkg = os.path.join(self.build_lib, "gpureclaim")
        for src, sub, name in ((lib, "lib", "libgpureclaim.so.0"), (cmd, "bin", "gpureclaim")):
            os.makedirs(os.path.join(pkg, sub), exist_ok=True)
            dst = os.path.join(pkg, sub, name)
            shutil.copyfile(src, dst)  # the file itself: a wheel keeps no symbolic links
            os.chmod(dst, 0o755)


cmdclass = {"build_py": build_py_native}
try:  # a platform wheel (native code inside) that any Python 3 can use: py3-none-linux_<arch>
    from wheel.bdist_wheel import bdist_wheel

    class bdist_wheel_native(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none") + super().get_tag()[2:]

    cmdclass["bdist_wheel"] = bdist_wheel_native
except ImportError:
    pass

setup(version=version(), cmdclass=cmdclass)
