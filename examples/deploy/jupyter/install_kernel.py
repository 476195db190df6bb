#!/usr/bin/env python3
"""Installs a Jupyter kernel that starts every notebook under gpureclaim, for the Python running this script.

    python3 install_kernel.py [--user | --sys-prefix | --prefix DIR] [--name NAME] [--display-name TEXT]

As `python -m ipykernel install` does, the kernel spec names this interpreter by its absolute path (and the
gpureclaim command by its own): a spec saying just "python3" runs whatever python3 comes first on the PATH
Jupyter was started with, often one without ipykernel ("No module named ipykernel_launcher"). Run it with the
interpreter (virtual environment, conda environment) the notebooks should use. Default --user: the user's
Jupyter data directory ($JUPYTER_DATA_DIR, else $XDG_DATA_HOME/jupyter, else ~/.local/share/jupyter).
"""
import argparse
import importlib.util
import json
import os
import shutil
import sys


def gpureclaim_command():
    """The argv that runs the gpureclaim command: the one on PATH, else the pip-installed package's."""
    found = shutil.which("gpureclaim")
    if found:
        with open(found, "rb") as f:
            if f.read(4) == b"\x7fELF":  # the command itself (pip's console script would be this Python again)
                return [os.path.abspath(found)]
    try:
        import gpureclaim.__main__ as m
        if m.command():
            return [sys.executable, "-m", "gpureclaim"]
    except ImportError:
        pass
    return None


def kernels_dir(args):
    if args.prefix:
        return os.path.join(args.prefix, "share", "jupyter", "kernels")
    if args.sys_prefix:
        return os.path.join(sys.prefix, "share", "jupyter", "kernels")
    data = os.environ.get("JUPYTER_DATA_DIR")
    if not data:
        xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        data = os.path.join(xdg, "jupyter")
    return os.path.join(data, "kernels")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="the user's Jupyter data directory (the default)")
    where.add_argument("--sys-prefix", action="store_true", help="this interpreter's prefix (a venv, conda env)")
    where.add_argument("--prefix", help="PREFIX/share/jupyter/kernels")
    ap.add_argument("--name", default="python3-gpureclaim", help="the kernel's directory name")
    ap.add_argument("--display-name", default="Python 3 (gpureclaim)", help="the name in the kernel menu")
    args = ap.parse_args()
    cmd = gpureclaim_command()
    if not cmd:
        sys.exit("install_kernel.py: the gpureclaim command is not found: install gpureclaim (pip install ., or "
                 "the .deb), or put the command on PATH")
    if importlib.util.find_spec("ipykernel_launcher") is None:
        sys.exit("install_kernel.py: %s has no ipykernel (pip install ipykernel): run this script with the Python "
                 "the notebooks should use" % sys.executable)
    spec = {
        "argv": cmd + ["run", "--", os.path.abspath(sys.executable), "-m", "ipykernel_launcher", "-f",
                       "{connection_file}"],
        "display_name": args.display_name,
        "language": "python",
        "env": {"GPURECLAIM_ON_SIGNAL": "cached,orphaned"},
        "metadata": {"debugger": True},
    }
    dest = os.path.join(kernels_dir(args), args.name)
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, "kernel.json")
    with open(path, "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
    print("installed kernel %s (%s) in %s" % (args.name, args.display_name, dest))


if __name__ == "__main__":
    main()
