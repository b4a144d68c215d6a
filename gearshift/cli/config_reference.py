"""The configuration reference (docs/operations/config-reference.md), generated from the settings classes:

    python -m gearshift.cli.config_reference          # write it
    python -m gearshift.cli.config_reference --check  # exit 1 if the committed page differs (a test runs this)

Each setting's description is the docstring under its field in the class source (the convention of every
settings class here), its type and default are pydantic's.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from gearshift.cli.settings_catalog import PROCESSES, TOOLING, Setting, settings_of

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "config-reference.md"

INTRO = """# Configuration reference

Generated from the settings classes by `python -m gearshift.cli.config_reference`; do not edit by hand (a test
fails when this page and the code disagree). How configuration is read, and the fleet and tenants files, are on
[Configuration](config.md).

Every process reads `GEARSHIFT_*` environment variables at start, plus the fleet and tenants YAML files they
name. An unknown `GEARSHIFT_*` variable is refused at start with the closest known name ("did you mean");
`GEARSHIFT_ALLOW_UNKNOWN_ENV=1` lets one through (a setting of a newer version during an upgrade). Outside the
embedded default (with `GEARSHIFT_REDIS_URL`, or listening beyond loopback), a development secret is refused
unless `GEARSHIFT_ALLOW_DEV_SECRETS=1`, and a placeholder such as `replace-me` always.

`gearshift config check [PROCESS]` validates the environment and the files as PROCESS would read them and prints
the effective configuration, secrets masked.

**Reloading.** Settings and files are read once, at start. After changing either, restart the processes: on
Kubernetes, `kubectl -n gearshift rollout restart deployment/gateway deployment/controller` (the gateways roll
one at a time, the controller's standby takes the lease) and, for a worker's fleet entry, the worker groups
(`kubectl -n gearshift rollout restart leaderworkerset/kimi-k3`: one group at a time, each drained first).
Tenants and keys created through the admin API need no restart.
"""


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string statement right after ``name: type = …``) of ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith(("pydantic", "builtins")):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def type_text(info: FieldInfo) -> str:
    return _type_name(info.annotation)


def _type_name(t: Any) -> str:
    origin, args = get_origin(t), get_args(t)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    if t is type(None):
        return "None"
    return str(getattr(t, "__name__", t))


def default_text(info: FieldInfo) -> str:
    if info.default is PydanticUndefined:
        return "required" if info.default_factory is None else "(computed)"
    value: Any = info.default
    if isinstance(value, SecretStr):
        return "(development value)"
    if value is None:
        return "unset"
    return f"`{value.value if hasattr(value, 'value') else value}`"


def _rows(settings: list[Setting]) -> Iterator[str]:
    yield "| variable | type | default | meaning |"
    yield "|---|---|---|---|"
    for s in settings:
        doc = field_docs(s.model).get(s.field.split(".")[-1], "").replace("|", "\\|")
        yield f"| `{s.env}` | {type_text(s.info)} | {default_text(s.info)} | {doc} |"


def render() -> str:
    common = PROCESSES["common"]
    common_fields = set(common.model_fields)
    parts = [INTRO]
    sections: list[tuple[str, type[BaseSettings], list[Setting]]] = [
        ("Every process (common)", common, list(settings_of(common)))
    ]
    for name, cls in PROCESSES.items():
        if name == "common":
            continue
        inherits = issubclass(cls, common)
        own = [s for s in settings_of(cls) if not inherits or s.field.split(".")[0] not in common_fields]
        sections.append((f"{name} (`{cls.__module__}.{cls.__name__}`)", cls, own))
    for title, cls, settings in sections:
        parts.append(f"## {title}\n")
        if cls is not common and issubclass(cls, common):
            parts.append("Also reads every common setting.\n")
        parts.append("\n".join(_rows(settings)) + "\n")
    parts.append("## Read by the deployment tooling, not by a process\n")
    parts.append("\n".join(f"- `{name}`" for name in sorted(TOOLING)) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"out of date: {PAGE} (run `python -m gearshift.cli.config_reference`)", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
