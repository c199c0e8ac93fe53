"""The house's import rules: dependencies point one way, the zoo cannot collide; no module is long.

Every ``import`` in memgrad/ and models/ (function-level ones included) is read from the
source with `ast`, so a late import cannot hide a dependency.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BOTTOM = ("memgrad._src.units", "memgrad._src.arguments", "memgrad._src.tf_internals", "memgrad._src.names",
          "memgrad._src.allocator")
TECHNIQUES = ("memgrad._src.replay", "memgrad._src.recompute", "memgrad._src.checkpointing", "memgrad._src.reversible",
              "memgrad._src.selective")
PUBLIC = ("memgrad", "memgrad.layers", "memgrad.selective", "memgrad.strategies", "memgrad.profiler")


def _module_name(path):
    relative = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    if relative.startswith("models"):
        relative = "memgrad_zoo" + relative[len("models"):]
    return relative[: -len(".__init__")] if relative.endswith(".__init__") else relative


def _imports():
    """{module: set of memgrad/memgrad_zoo/models modules it imports}."""
    found, raw = {}, {}
    for folder in ("memgrad", "models"):
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(directory, name)
                module = _module_name(path)
                tree = ast.parse(open(path, encoding="utf-8").read(), path)
                targets = set()
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        targets.update(alias.name for alias in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                        targets.add((node.module, tuple(alias.name for alias in node.names)))
                raw[module] = targets
    for module, targets in raw.items():
        resolved = set()
        for target in targets:
            if isinstance(target, str):
                resolved.add(target)
                continue
            package, names = target  # `from package import a, b`: submodules count as themselves
            submodules = [f"{package}.{n}" for n in names if f"{package}.{n}" in raw]
            resolved.update(submodules)
            if len(submodules) < len(names):
                resolved.add(package)
        found[module] = {t for t in resolved if t.split(".")[0] in ("memgrad", "memgrad_zoo", "models")}
    return found


IMPORTS = _imports()


def _under(module, prefixes):
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(sources, allowed):
    """Imports from modules under ``sources`` of anything outside ``allowed`` (itself allowed)."""
    bad = []
    for module, targets in sorted(IMPORTS.items()):
        if not _under(module, sources):
            continue
        own = [s for s in sources if _under(module, [s])]
        for target in sorted(targets):
            if not _under(target, list(allowed) + own):
                bad.append(f"{module} imports {target}")
    return bad


def test_the_scan_sees_the_package():
    assert "memgrad._src.checkpointing.rewrite" in IMPORTS
    assert "memgrad_zoo.glow" in IMPORTS
    assert "memgrad.cli.sweep" in IMPORTS
    assert "memgrad._src.tf_internals" in IMPORTS["memgrad._src.checkpointing.rewrite"]


def test_bottom_modules_import_nothing_of_memgrad():
    for module in BOTTOM:
        assert _violations([module], []) == []
        assert IMPORTS[module] == set(), IMPORTS[module]


def test_graph_imports_only_the_bottom():
    assert _violations(["memgrad._src.graph"], BOTTOM) == []


def test_the_profiler_imports_no_technique_no_zoo_no_cli():
    # The read-only graph layer is allowed: predict_peak simulates a traced graph with it.
    assert _violations(["memgrad._src.profiler"], BOTTOM + ("memgrad._src.graph",)) == []


def test_each_technique_imports_only_the_layers_below_and_the_shared_recompute_and_replay():
    for technique in TECHNIQUES:
        allowed = BOTTOM + ("memgrad._src.graph", "memgrad._src.replay", "memgrad._src.recompute")
        assert _violations([technique], allowed) == [], technique


def test_the_public_namespaces_import_only_the_implementation():
    bad = []
    for module in PUBLIC:
        for target in IMPORTS[module]:
            if not (_under(target, ["memgrad._src"]) or target in PUBLIC):
                bad.append(f"{module} imports {target}")
    assert bad == []


def test_nothing_below_the_cli_imports_the_cli_or_the_zoo():
    bad = [f"{module} imports {target}" for module, targets in IMPORTS.items()
           if not _under(module, ["memgrad.cli", "memgrad_zoo"])
           for target in targets if _under(target, ["memgrad.cli", "memgrad_zoo", "models"])]
    assert bad == []


def test_the_cli_uses_only_public_memgrad():
    bad = [f"{module} imports {target}" for module, targets in IMPORTS.items()
           if _under(module, ["memgrad.cli"])
           for target in targets if _under(target, ["memgrad._src"])]
    assert bad == []


def test_the_zoo_uses_only_public_memgrad_and_never_the_name_models():
    bad = [f"{module} imports {target}" for module, targets in IMPORTS.items()
           if _under(module, ["memgrad_zoo"])
           for target in targets
           if _under(target, ["memgrad._src", "memgrad.cli", "models"])]
    assert bad == []


def _fresh(code, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_the_installed_zoo_is_memgrad_zoo_and_models_is_not_importable(tmp_path):
    """From another folder: ``import models`` fails; every zoo module loads once, as memgrad_zoo."""
    code = """
import importlib.util, sys
assert importlib.util.find_spec("models") is None, "a top-level 'models' is installed"
import memgrad_zoo.glow, memgrad_zoo.densenet, memgrad_zoo.revnet, memgrad_zoo.resnet, memgrad_zoo.train
files = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and (name.startswith("memgrad") or name.startswith("models")):
        files.setdefault(path, []).append(name)
twice = {p: n for p, n in files.items() if len(n) > 1}
assert not twice, twice
assert not any(n == "models" or n.startswith("models.") for n in sys.modules)
print("ok", memgrad_zoo.__file__)
"""
    done = _fresh(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")
    assert os.path.join("models", "__init__.py") in done.stdout  # the repository folder, renamed


def test_no_two_modules_of_the_implementation_share_a_file_name():
    seen = {}
    for directory, _, files in os.walk(os.path.join(ROOT, "memgrad", "_src")):
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                seen.setdefault(name, []).append(os.path.relpath(os.path.join(directory, name), ROOT))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_module_imports_another_modules_private_names():
    """A module that needs a sibling's ``_private`` name is one idea cut in two: siblings talk
    through names without a leading underscore (under memgrad/_src those are still internal)."""
    private = []
    for folder in ("memgrad", "models", "scripts"):
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in (n for n in files if n.endswith(".py")):
                path = os.path.join(directory, name)
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
                    if isinstance(node, ast.ImportFrom):
                        private += [f"{os.path.relpath(path, ROOT)}:{node.lineno} imports {alias.name} from "
                                    f"{'.' * node.level}{node.module or ''}" for alias in node.names
                                    if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == [], private


def test_memgrad_gradients_reads_as_its_steps():
    """The entry point is at most 60 lines below its docstring: the steps, each a function."""
    path = os.path.join(ROOT, "memgrad", "_src", "checkpointing", "api.py")
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    (function,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "gradients"]
    assert ast.get_docstring(function)
    lines = function.end_lineno - function.body[1].lineno + 1
    assert lines <= 60, f"memgrad.gradients is {lines} lines below its docstring"


MAX_MODULE_LINES = 500


def test_no_module_of_the_library_the_zoo_or_the_scripts_is_over_500_lines():
    long = []
    for folder in ("memgrad", "models", "scripts"):
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    with open(path, encoding="utf-8") as source:
                        count = sum(1 for _ in source)
                    if count > MAX_MODULE_LINES:
                        long.append(f"{os.path.relpath(path, ROOT)}: {count} lines")
    assert long == [], "split these modules: " + "; ".join(long)
