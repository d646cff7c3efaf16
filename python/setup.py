"""Builds pswitch._pswitch, the C++ client's bindings, with CMake (client-only: no libtorch).

The C++ sources are the repository around this folder; CMake >= 3.22, a C++20 compiler,
pybind11, Abseil, FlatBuffers, Asio and nlohmann-json must be installed (tools/install-deps.sh).
"""
import os
import pathlib
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not (REPO / "client" / "client.h").exists():
            raise RuntimeError(f"the pswitch C++ sources are not at {REPO}: build from the "
                               "repository (pip install ./python), not from a copied folder")
        target = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        jobs = str(max(1, min(os.cpu_count() or 1, 8)))
        subprocess.run(["cmake", "-S", str(REPO), "-B", str(build), "-DPSWITCH_CLIENT_ONLY=ON",
                        "-DCMAKE_BUILD_TYPE=Release", f"-DPSWITCH_PYTHON={sys.executable}"],
                       check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "pswitch_python_module",
                        "-j", jobs], check=True)
        built = next((build / "python" / "pswitch").glob("_pswitch*.so"))
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built), str(target))


setup(ext_modules=[CMakeExtension("pswitch._pswitch")], cmdclass={"build_ext": CMakeBuild})
