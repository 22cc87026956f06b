"""The native kernel library (src/verispec/kernels/csrc), compiled from source at install time.

A plain C library with no Python API, loaded with ctypes (see verispec/kernels/native.py): it needs neither
torch's C++ headers nor a second torch in pip's build environment. No -march flag for the library as a whole:
each vector path is compiled for its instruction set and chosen at run time, so a build made on one CPU runs
on another. On x86-64 the paths use function-level target pragmas; on AArch64 the translation units of the
optional instructions (sdot, smmla) get their own -march flag below, and the rest stays baseline armv8-a
(Advanced SIMD). No fused multiply-adds beyond the explicit ones (-ffp-contract=off): the portable path's
roundings are the ones every path reproduces. Without a compiler the build is skipped and verispec runs
PyTorch's kernels.
"""

import platform
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.errors import CompileError
except ImportError:  # older setuptools
    from distutils.errors import CompileError

# AArch64 translation units using optional instructions, and the flag enabling them; a compiler that rejects the
# flag builds the file without it, and the file then offers no kernels (its path is never chosen)
ARM_FLAGS = {
    "vsk_neon_dot.c": "-march=armv8.2-a+dotprod",
    "vsk_tiles_neon_dot.c": "-march=armv8.2-a+dotprod",
    "vsk_tiles_neon_i8mm.c": "-march=armv8.2-a+dotprod+i8mm",
}
AARCH64 = platform.machine().lower() in ("aarch64", "arm64")


class BuildExt(build_ext):
    """build_ext with the per-file flags of ARM_FLAGS (setuptools has one set of flags per extension)."""

    def build_extension(self, ext):
        compile_one = getattr(self.compiler, "_compile", None)
        if not AARCH64 or compile_one is None:
            return super().build_extension(ext)

        def compile_with_flag(obj, src, src_ext, cc_args, extra_postargs, pp_opts):
            flag = ARM_FLAGS.get(Path(src).name)
            if flag:
                try:
                    return compile_one(obj, src, src_ext, cc_args, [*extra_postargs, flag], pp_opts)
                except CompileError:
                    pass
            return compile_one(obj, src, src_ext, cc_args, extra_postargs, pp_opts)

        self.compiler._compile = compile_with_flag
        try:
            return super().build_extension(ext)
        finally:
            self.compiler._compile = compile_one


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "verispec.kernels._vsk",
            sources=sorted(glob("src/verispec/kernels/csrc/*.c")),
            depends=sorted(glob("src/verispec/kernels/csrc/*.h")),
            extra_compile_args=["-O3", "-std=c11", "-fvisibility=hidden", "-fno-strict-aliasing", "-ffp-contract=off"],
            libraries=["m", "pthread"],
            optional=True,
        )
    ],
)
