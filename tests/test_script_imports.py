"""The benchmark and device scripts run only on the GPU machine or by hand, so CI
would not see one import a name the package no longer has (session 39 removed
convert.replace_linear while two eval scripts still used it). Each `from fp8ext...
import name` of theirs must resolve here, without running the script."""
import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("scripts/**/*.py")])


def fp8ext_imports(path: pathlib.Path):
    """(module, name) for every `from fp8ext[.x] import name` in the file."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fp8ext":
            for alias in node.names:
                yield node.module, alias.name


def test_scripts_were_found():
    assert len(SCRIPTS) >= 10 and any(p.name == "eval_perplexity.py" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fp8ext_name_a_script_imports_exists(path):
    for module, name in fp8ext_imports(path):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):  # `from fp8ext import nn` names a submodule
            importlib.import_module(f"{module}.{name}")


def bench_imports(path: pathlib.Path):
    """(module, name) for every `from benchlib / bench_x import name` in the file
    (the bench/ modules the scripts share, imported with bench/ on sys.path)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and \
                (node.module == "benchlib" or node.module.startswith("bench_")):
            for alias in node.names:
                yield node.module, alias.name


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bench_name_a_script_imports_exists(path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    for module, name in bench_imports(path):
        assert hasattr(importlib.import_module(module), name), f"{path.name}: {module} has no {name}"
