"""The build's one addition to pyproject.toml: a clear line when the compiled module cannot be
built (no C compiler, or no Python headers), instead of the compiler's output alone."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError


class BuildExtensions(build_ext):
    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, ExecError, PlatformError, OSError) as exc:
            raise SystemExit(
                f"spanner-cdc: building {ext.name} needs a C compiler and Python's headers "
                f"(Debian: apt-get install gcc libc6-dev python3-dev; `make` installs them): {exc}"
            ) from None


setup(cmdclass={"build_ext": BuildExtensions})
