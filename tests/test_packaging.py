"""What `pip install tfxl` puts into site-packages: the top-level folders train/ and tpu/ install
as tfxl.train and tfxl.tpu, never as bare `train`/`tpu` names (BUILD.md, "Installing")."""

import configparser
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def setup_options():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    options = config["options"]
    packages = options["packages"].split()
    package_dir = dict(line.split(" = ") for line in options["package_dir"].strip().splitlines())
    return packages, package_dir


def test_every_package_of_the_tree_is_installed_under_tfxl():
    packages, package_dir = setup_options()
    assert package_dir == {"tfxl.train": "train", "tfxl.tpu": "tpu"}
    def folder(name):  # a package below a package_dir entry lies in that entry's folder
        top = next((key for key in package_dir if name == key or name.startswith(key + ".")),
                   None)
        if top is None:
            return name.replace(".", "/")
        return "/".join([package_dir[top], *name[len(top) + 1:].split(".")]).rstrip("/")
    folder_of = {name: folder(name) for name in packages}
    in_tree = {str(path.parent.relative_to(ROOT)) for top in ("tfxl", "train", "tpu")
               for path in (ROOT / top).rglob("__init__.py")}
    assert sorted(folder_of.values()) == sorted(in_tree)
    assert all(name == "tfxl" or name.startswith("tfxl.") for name in packages)


def test_every_console_script_is_a_tfxl_cli_scripts_entry_point():
    """The console scripts start in tfxl.cli.scripts, which quiets TensorFlow before the tool's
    module loads it (tests/test_cli_import.py: that module loads no TensorFlow)."""
    from tfxl.cli import TOOLS, scripts
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    entry_points = dict(line.split(" = ") for line in
                        config["options.entry_points"]["console_scripts"].strip().splitlines())
    assert set(entry_points) == {name for name in TOOLS if name.startswith("tfxl-")}
    for name, target in entry_points.items():
        module, function = target.split(":")
        assert module == "tfxl.cli.scripts" and callable(getattr(scripts, function)), name


@pytest.mark.large
@pytest.mark.subprocess
def test_installed_names_are_tfxl_train_and_tfxl_tpu_only(tmp_path):
    """From outside the repository (no source folder on sys.path), as an installed user sees it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = ("import importlib.util as u, json; print(json.dumps({n: u.find_spec(n) is not None "
             "for n in ('train', 'tpu', 'tfxl.train', 'tfxl.tpu', 'tfxl.train.loop.train_step', "
             "'tfxl.tpu.strategy')}))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True, check=True)
    found = result.stdout.strip().splitlines()[-1]
    assert found == ('{"train": false, "tpu": false, "tfxl.train": true, "tfxl.tpu": true, '
                     '"tfxl.train.loop.train_step": true, "tfxl.tpu.strategy": true}')
