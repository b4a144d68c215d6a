"""``workers.vllm.profile_server``'s two pieces that run without vLLM: the ``sitecustomize`` that profiles only a
``multiprocessing`` child (the EngineCore) and dumps on SIGUSR2, and the per-step call counts read off a dump."""

from __future__ import annotations

import cProfile
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workers.vllm.profile_server import PROFILE_DIR_ENV, SITECUSTOMIZE, calls_of


def _start(site: Path, out: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(site), PROFILE_DIR_ENV: str(out)}
    code = "import time\nwhile True: time.sleep(0.05)"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env)


def test_only_a_multiprocessing_child_is_profiled_and_it_dumps_on_sigusr2(tmp_path: Path) -> None:
    site, out = tmp_path / "site", tmp_path / "out"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    api_server = _start(site, out)
    engine = _start(site, out, "--multiprocessing-fork")
    try:
        deadline = time.monotonic() + 30
        while not list(out.glob("engine-*.pid")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.name for p in out.glob("engine-*.pid")] == [f"engine-{engine.pid}.pid"]
        os.kill(engine.pid, signal.SIGUSR2)
        target = out / f"engine-{engine.pid}.prof"
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert target.exists()
        assert api_server.poll() is None  # never signalled, never profiled
    finally:
        for proc in (api_server, engine):
            proc.kill()
            proc.wait()


def test_calls_per_step_count_the_engine_cores_step(tmp_path: Path) -> None:
    core = tmp_path / "vllm" / "v1" / "engine" / "core.py"
    core.parent.mkdir(parents=True)
    core.write_text("def helper():\n    return 1\n\ndef step():\n    return helper() + helper()\n")
    spec = importlib.util.spec_from_file_location("fake_core", core)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3):
        module.step()
    profile.disable()
    profile.dump_stats(str(tmp_path / "p.prof"))
    steps, calls = calls_of(tmp_path / "p.prof")
    assert steps == 3
    assert calls["core.py:1:helper"][0] == 6
