"""Safe configuration (issue 27): an unknown ``GEARSHIFT_*`` variable is refused at start with the closest known
name, a placeholder secret is refused outside the embedded default, ``gearshift config check`` validates and prints
the effective configuration with secrets masked, the configuration reference is in step with the settings classes,
and ``gearshift --version`` answers."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from gearshift.cli import config_reference
from gearshift.cli.app import app
from gearshift.cli.settings_catalog import PROCESSES, known_variables, settings_of, unknown_variables

from .deploy_contracts import env_names


def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(argv), env=env)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("GEARSHIFT_REDIS_ULR", "GEARSHIFT_REDIS_URL"),
        ("GEARSHIFT_CONTROL_TOKN", "GEARSHIFT_CONTROL_TOKEN"),
        ("GEARSHIFT_STORE_FAILUR_MODE", "GEARSHIFT_STORE_FAILURE_MODE"),
    ],
)
def test_an_unknown_variable_is_refused_at_start_with_did_you_mean(typo: str, meant: str) -> None:
    code, output = run("usage", "retain", "--max-age", "1d", env={typo: "redis://127.0.0.1:1/0"})
    assert code == 2
    assert f"{typo} (did you mean {meant}?)" in output
    code, output = run("usage", "retain", "--max-age", "1d", env={typo: "x", "GEARSHIFT_ALLOW_UNKNOWN_ENV": "1"})
    assert "did you mean" not in output, "the escape hatch for an upgrade lets it through"


def test_the_catalogue_knows_every_variable_every_process_reads() -> None:
    for cls in PROCESSES.values():
        assert env_names(cls) <= known_variables(), cls.__name__
    assert (
        unknown_variables({"GEARSHIFT_PORT": "1", "GEARSHIFT_SIM_PORT": "2", "GEARSHIFT_PLACEMENT__ENABLED": "1"}) == []
    )
    assert unknown_variables({"GEARSHIFT_ZZZ": "1"}) == [("GEARSHIFT_ZZZ", None)]


@pytest.mark.parametrize(
    "env",
    [
        {"GEARSHIFT_HOST": "0.0.0.0", "GEARSHIFT_ADMIN_KEY": "replace-me"},
        {"GEARSHIFT_REDIS_URL": "redis://:replace-me@redis:6379/0", "GEARSHIFT_ALLOW_DEV_SECRETS": "1"},
        {
            "GEARSHIFT_REDIS_URL": "redis://127.0.0.1:1/0",
            "GEARSHIFT_KEY_PEPPER": "Replace-Me",
            "GEARSHIFT_ALLOW_DEV_SECRETS": "1",
        },
    ],
)
def test_placeholder_secrets_are_refused_outside_the_embedded_default(env: dict[str, str]) -> None:
    code, output = run("config", "check", "gateway", "--quiet", env=env)
    assert code == 2, output
    assert "placeholder" in output


def test_a_placeholder_is_accepted_in_the_embedded_default() -> None:
    code, output = run("config", "check", "gateway", "--quiet", env={"GEARSHIFT_ADMIN_KEY": "replace-me"})
    assert code == 0, output


def test_config_check_prints_the_effective_configuration_with_secrets_masked() -> None:
    env = {
        "GEARSHIFT_REDIS_URL": "redis://:hunter2-but-long@redis:6379/0",
        "GEARSHIFT_ADMIN_KEY": "a-real-admin-key-0123456789",
        "GEARSHIFT_KEY_PEPPER": "a-real-pepper-0123456789",
        "GEARSHIFT_CONTROL_TOKEN": "a-real-control-token-0123456789",
        "GEARSHIFT_PORT": "9999",
    }
    code, output = run("config", "check", "gateway", env=env)
    assert code == 0, output
    lines = dict(line.split("=", 1) for line in output.splitlines() if line.startswith("GEARSHIFT_"))
    assert lines["GEARSHIFT_PORT"] == "9999"
    assert lines["GEARSHIFT_REDIS_URL"] == "redis://:********@redis:6379/0"
    assert lines["GEARSHIFT_ADMIN_KEY"] == "********"
    for secret in env.values():
        if "real" in secret or "hunter2" in secret:
            assert secret not in output
    every = {s.env for s in settings_of(PROCESSES["gateway"])}
    assert set(lines) == every, "every setting, set or defaulted"
    assert "fleet: 1 models, 2 workers" in output
    assert output.rstrip().endswith("ok: gateway would start with this configuration")


def test_config_check_names_the_field_of_a_bad_value_and_a_bad_file(tmp_path: object) -> None:
    code, output = run("config", "check", "controller", "--quiet", env={"GEARSHIFT_TICK_S": "-1"})
    assert code == 2
    assert "tick_s: Input should be greater than 0" in output
    code, output = run("config", "check", "gateway", "--quiet", env={"GEARSHIFT_FLEET_FILE": "/nonexistent/fleet.yaml"})
    assert code == 2
    assert "fleet.yaml" in output


def test_the_configuration_reference_is_in_step_with_the_settings_classes() -> None:
    assert config_reference.main(["--check"]) == 0, "run `python -m gearshift.cli.config_reference`"
    page = config_reference.PAGE.read_text()
    for cls in PROCESSES.values():
        for name in env_names(cls):
            assert f"`{name}`" in page, name


def test_version() -> None:
    code, output = run("--version")
    assert code == 0
    assert output.strip() == f"gearshift {version('gearshift')}"
