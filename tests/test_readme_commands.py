"""The README's install and test commands work as written: the extras its install line names
bring the tools its test line runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _install_and_test_lines():
    """The first ```bash block of the README: its `pip install` line and its pytest line."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no ```bash block with the install and test commands"
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    install = [line for line in lines if line.startswith("pip install")]
    test = [line for line in lines if "pytest" in line]
    assert install and test, f"expected a pip install line and a pytest line. Received: {lines}"
    return install[0], test[0]


def _extras():
    """pyproject.toml's optional dependencies: extra name -> distribution names."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the toml table read by hand, as lines
        tomllib = None
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    if tomllib is not None:
        table = tomllib.loads(text)["project"]["optional-dependencies"]
    else:
        section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        table = {name: re.findall(r'"([^"]+)"', body)
                 for name, body in re.findall(r"^(\w+)\s*=\s*\[(.*?)\]", section, re.S | re.M)}
    return {name: {re.split(r"[<>=\[ ;]", spec, maxsplit=1)[0].lower() for spec in specs}
            for name, specs in table.items()}


def test_readme_install_line_brings_what_its_test_line_runs():
    install, test = _install_and_test_lines()
    assert test.startswith("python -m pytest"), test
    named = re.search(r"\.\[([\w,]+)\]", install)
    assert named, f"the install line names no extras. Received: {install!r}"
    extras = _extras()
    brought = set()
    for extra in named.group(1).split(","):
        assert extra in extras, f"README's install line names an unknown extra {extra!r}"
        brought |= extras[extra]
    needed = {"pytest", "hypothesis"} | ({"pytest-xdist"} if re.search(r"\s-n\s", test + " ") else set())
    missing = needed - brought
    assert not missing, f"README's install line ({install!r}) does not bring {sorted(missing)}"
