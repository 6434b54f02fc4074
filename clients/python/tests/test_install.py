"""The package installs with pip into a fresh virtual environment and imports from there.

Offline, so that it cannot depend on PyPI: the venv sees the system's setuptools and wheel
(`--system-site-packages`; Debian's python3-pip brings both) and pip builds with them
(`--no-build-isolation --no-index`), which is README's `pip install ./clients/python` less
the download of the build backend. The source is copied first: a setuptools build writes
`build/` and `*.egg-info` beside it.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent


def run(args, **kwargs):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)
    assert r.returncode == 0, f"{' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def test_pip_installs_it_into_a_fresh_venv_and_it_imports_as_roost_client(tmp_path):
    for module in ("venv", "ensurepip", "setuptools", "wheel"):
        probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
        if probe.returncode != 0:
            pytest.fail(
                f"{sys.executable} lacks {module}: install python3-venv and python3-pip"
                " (apt-get install python3-venv python3-pip)",
                pytrace=False,
            )
    src = tmp_path / "src"
    shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "build"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    py = venv / "bin" / "python"
    run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", src])
    # From a directory that holds no roost_client: only the installed one can be imported.
    out = run(
        [
            py,
            "-c",
            "import importlib.metadata as m, os, roost_client;"
            "print(roost_client.__file__);"
            "print(m.version('roost-client'));"
            "print(os.path.exists(os.path.join(os.path.dirname(roost_client.__file__), 'py.typed')));"
            "print(roost_client.Stream.__name__, roost_client.NotRunning.__mro__[1].__name__)",
        ],
        cwd=tmp_path,
    ).stdout.split("\n")
    site = venv / "lib"
    assert Path(out[0]).is_relative_to(site), f"imported from {out[0]}, not the venv's {site}"
    version = re.search(r'^version = "([^"]+)"', (SOURCE / "pyproject.toml").read_text(), re.M)
    assert version and out[1] == version.group(1), out
    assert out[2] == "True", "py.typed is not installed: type checkers would ignore the hints"
    assert out[3] == "Stream ConnectionLost", out
