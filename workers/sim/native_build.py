"""Build, check or remove the lab's compiled modules (``workers.sim.native``).

python -m workers.sim.native_build build | status | clean
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from workers.sim.native import MANIFEST, MODULES, NATIVE_ROOT, ROOT, digest, suffix, usable

_SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(name="gearshift-lab-native", ext_modules=mypycify({paths!r}, opt_level="3", separate=True),
      script_args=["build_ext", "--build-lib", {build_lib!r}, "--build-temp", {build_temp!r}])
"""


def clean() -> None:
    """Remove the compiled modules: the sources are loaded again."""
    shutil.rmtree(NATIVE_ROOT, ignore_errors=True)


def build(modules: tuple[str, ...] = MODULES) -> None:
    """Compile ``modules`` into ``NATIVE_DIR`` and write the manifest last (a failed build leaves none)."""
    clean()
    work = NATIVE_ROOT / "work"
    work.mkdir(parents=True)
    digests = {m: digest(m) for m in modules}
    paths = [f"workers/sim/{m}.py" for m in modules]
    setup = work / "setup.py"
    setup.write_text(_SETUP.format(paths=paths, build_lib=str(NATIVE_ROOT), build_temp=str(work / "temp")))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(setup)], cwd=ROOT, env=env, check=True)  # mypyc writes build/ C sources
    if any(want != digest(m) for m, want in digests.items()):
        raise RuntimeError("a module changed during the build: build again")
    MANIFEST.write_text(json.dumps({"suffix": suffix(), "modules": digests}, indent=1) + "\n")


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        build()
    elif argv == ["clean"]:
        clean()
    elif argv != ["status"]:
        print(__doc__, file=sys.stderr)
        return 2
    ok, why = usable()
    print(("in use: " if ok else "not in use: ") + why)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
