"""pyproject.toml and environment.yml declare the same dependencies; the CLI entry point loads."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PIP_TO_CONDA = {"torch": "pytorch"}
CONDA_ONLY = {"python", "pip"}  # the interpreter and the tool that installs `-e .`


def _split(requirement: str) -> tuple[str, str]:
    """('scikit-learn', '>=1.2') from 'scikit-learn>=1.2'; names normalized like PEP 503."""
    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(.*?)\s*", requirement)
    assert match, f"cannot parse requirement {requirement!r}"
    name, spec = match.groups()
    return re.sub(r"[-_.]+", "-", name).lower(), spec.replace(" ", "")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pip_deps() -> dict[str, str]:
    project = _pyproject()["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["dev"]
    pairs = (_split(r) for r in reqs)
    return {PIP_TO_CONDA.get(name, name): spec for name, spec in pairs}


def _conda_env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _conda_deps() -> dict[str, str]:
    entries = [d for d in _conda_env()["dependencies"] if isinstance(d, str)]
    pairs = (_split(d) for d in entries)
    return {name: spec for name, spec in pairs if name not in CONDA_ONLY}


def test_every_pip_dependency_is_in_environment_yml():
    missing = sorted(set(_pip_deps()) - set(_conda_deps()))
    assert not missing, f"add to environment.yml (conda names): {missing}"


def test_every_conda_dependency_is_in_pyproject():
    extra = sorted(set(_conda_deps()) - set(_pip_deps()))
    assert not extra, f"add to pyproject.toml, or drop from environment.yml: {extra}"


def test_version_floors_agree():
    pip, conda = _pip_deps(), _conda_deps()
    differ = {n: (pip[n], conda[n]) for n in pip.keys() & conda.keys() if pip[n] != conda[n]}
    assert not differ, f"pyproject vs environment.yml specifiers differ: {differ}"


def test_environment_yml_installs_the_package_and_the_right_python():
    env = _conda_env()
    assert env["name"] == "ddp-lab"
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert pip_sections == [["-e ."]]
    assert "pip" in env["dependencies"]
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert python == ["python=3.11"]


def test_entry_point_resolves_to_a_callable():
    value = _pyproject()["project"]["scripts"]["ddp-lab"]
    main = metadata.EntryPoint(name="ddp-lab", value=value, group="console_scripts").load()
    assert callable(main)


def test_installed_entry_point_matches_pyproject():
    """Catches a stale install: entry points are recorded when `pip install -e .` runs."""
    try:
        dist = metadata.distribution("ddp-lab")
    except metadata.PackageNotFoundError:
        pytest.skip("ddp-lab is not pip-installed in this environment")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts.get("ddp-lab") == _pyproject()["project"]["scripts"]["ddp-lab"]
