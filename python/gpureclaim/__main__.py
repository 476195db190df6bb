"""``python -m gpureclaim ARGS...`` is the ``gpureclaim`` command: ``python -m gpureclaim run -- python train.py``.

The pip-installed package carries the command in gpureclaim/bin/ (and the library it preloads in
gpureclaim/lib/, where the command finds it); elsewhere (the source tree, a CMake or Debian install) the
``gpureclaim`` command on PATH is run. The command replaces this interpreter (exec): its exit status, signals
and standard streams are the command's own.
"""
import os
import shutil
import sys


def command():
    """The path of the gpureclaim command this package runs, or None."""
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "gpureclaim")
    if os.access(bundled, os.X_OK):
        return bundled
    found = shutil.which("gpureclaim")
    # The console script pip installs is this module again: never exec it in a loop.
    if found and os.path.realpath(found) != os.path.realpath(sys.argv[0] or ""):
        with open(found, "rb") as f:
            if f.read(4) == b"\x7fELF":
                return found
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cmd = command()
    if cmd is None:
        sys.stderr.write("gpureclaim: the gpureclaim command is not installed: `pip install .` in gpureclaim's "
                         "source tree installs it with this package\n")
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd, [cmd] + list(argv))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
