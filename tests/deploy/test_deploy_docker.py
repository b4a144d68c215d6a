"""deploy/docker: the images copy every package the project installs, install no extra (so the lab's plotting
and numerics stay out of the services), and the vLLM image uses the same vLLM version and plugin requirements as
the CI's CPU worker (scripts/vllm-env.sh). No Docker engine here: read."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from .deploy_contracts import ROOT

DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = ("Dockerfile", "vllm.Dockerfile")


def shell_variable(name: str) -> str:
    match = re.search(rf"^{name}=\"?([^\"\n]*)\"?$", (ROOT / "scripts" / "vllm-env.sh").read_text(), re.MULTILINE)
    assert match, f"scripts/vllm-env.sh no longer sets {name}"
    return match.group(1)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_copy_every_installed_package_from_paths_that_exist(name: str) -> None:
    text = (DOCKER / name).read_text()
    copied = [s for line in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE) for s in line.split()]
    for source in copied:
        assert (ROOT / source).exists(), f"{name}: COPY {source}: no such path"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in (p.rstrip("*") for p in packages):
        assert f"{package}/" in copied, f"{name}: package {package} is installed by pyproject but not copied"
    assert "pyproject.toml" in copied
    ignore = (DOCKER / f"{name}.dockerignore").read_text().split()
    assert "**/.venv*" in ignore


def test_vllm_image_matches_the_ci_worker() -> None:
    text = (DOCKER / "vllm.Dockerfile").read_text()
    assert f"FROM vllm/vllm-openai:v{shell_variable('VLLM_CPU_VERSION')}" in text
    for requirement in shell_variable("PLUGIN_REQUIREMENTS").split():
        assert requirement in text, f"vllm.Dockerfile does not install the plugin requirement {requirement}"
    assert re.search(r'^ENTRYPOINT \["/opt/gearshift/bin/gearshift"\]$', text, re.MULTILINE)
    assert 'ENTRYPOINT ["gearshift"]' in (DOCKER / "Dockerfile").read_text()


def test_images_install_no_extra_and_every_command_starts_without_the_bench_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench = {re.split(r"[=<>!~\[]", r)[0] for r in project["optional-dependencies"]["bench"]}
    core = {re.split(r"[=<>!~\[]", r)[0] for r in project["dependencies"]}
    assert {"matplotlib", "numpy"} <= bench
    assert not bench & core
    for name in DOCKERFILES:
        targets = re.findall(r"pip install (?:--no-deps )?(\.\S*)", (DOCKER / name).read_text())
        assert targets, f"{name} does not install the project"
        assert set(targets) == {"."}, f"{name} installs an extra: {targets}"
    # Every command registers at import; none may need the bench extra to start (the lab's commands import it
    # when they run).
    probe = "import sys; sys.modules.update(dict.fromkeys(%r)); from gearshift.cli.app import app; app(['--help'])"
    argv = [sys.executable, "-c", probe % sorted(bench)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
