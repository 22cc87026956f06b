"""The native kernel library (src/verispec/kernels/csrc), compiled from source at install time.

A plain C library with no Python API, loaded with ctypes (see verispec/kernels/native.py): it needs neither
torch's C++ headers nor a second torch in pip's build environment. No -march flag: each vector path is
compiled for its instruction set (function-level target pragmas) and chosen at run time, so a build made on
one CPU runs on another. Without a compiler the build is skipped and verispec runs PyTorch's kernels.
"""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "verispec.kernels._vsk",
            sources=sorted(glob("src/verispec/kernels/csrc/*.c")),
            depends=sorted(glob("src/verispec/kernels/csrc/*.h")),
            extra_compile_args=["-O3", "-std=c11", "-fvisibility=hidden", "-fno-strict-aliasing"],
            libraries=["m", "pthread"],
            optional=True,
        )
    ]
)
