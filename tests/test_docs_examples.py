"""Every ```python block of README.md, CONTRIBUTING.md and docs/*.md runs, as shown.

Each block runs in a fresh process (forked from a warm interpreter that has imported TensorFlow,
as the suite's probes are: tests/conftest.py), in an empty temporary directory, with this
checkout's ``memgrad`` and ``memgrad_zoo`` first on the path; what it prints is what its
``print`` calls write to ``sys.stdout``. HTML comments on the
lines just above a block's fence steer it (CONTRIBUTING.md describes them):

- ``<!-- continued -->``: the block runs appended to the block(s) before it in the same file.
  A chain of continued blocks is one test, named after its first block: the chain's first
  block runs as the start of it.
- ``<!-- slow: reason -->``: the test is marked ``slow`` (a chain is slow if any block is).
  Every file's chains but the README's are marked ``slow`` too (`FAST_FILES`): each pays a
  fresh interpreter's TensorFlow import, and the fast suite keeps only the front door's.
- ``<!-- not-run: reason -->``: the test is skipped with the reason; only for what needs
  hardware or a cluster (several GPUs, several workers). A reason is required.
- ``<!-- output -->`` on a ```text block: it is what the python block(s) before it print,
  every number a ``#`` (`skeleton`): the end of the output, line for line, where a ``...``
  line stands for lines left out (`sample_mismatch`). A sample cannot fall behind the code.

Shell blocks are not executed, but every ``memgrad-profile`` flag they (and the sample
outputs) show must be one the command's ``--help`` lists.
"""

import glob
import os
import re

import pytest

from memgrad._src.profiler.fresh import FreshProcessError, run_in_fresh_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 180  # a block that is not slow runs in a few seconds on 2 cores
SLOW_TIMEOUT_S = 600
MARKER = re.compile(r"^<!--\s*([a-z-]+)\s*(?::\s*(.*?))?\s*-->$")
KNOWN_MARKERS = {"continued", "slow", "not-run", "output"}
FAST_FILES = {"README.md"}  # whose examples (not marked slow) run in plain `python -m pytest`

# The example runs in a fresh process (tests/example_runner.py), forked from the suite's warm
# interpreter that has imported TensorFlow (conftest.py): memgrad from this checkout
# (PYTHONPATH, see example_environment), this checkout's models/ as memgrad_zoo (an editable
# install may point at another checkout), the example run as __main__, its own directory first
# on sys.path as for a script.
RUNNER = "tests.example_runner:run_example"


def example_environment():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def documentation_files():
    names = ["README.md", "CONTRIBUTING.md"] + sorted(
        os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [name for name in names if os.path.exists(os.path.join(ROOT, name))]


def fenced_blocks(name, text=None):
    """[(line, language, code, {marker: reason})] of one file (or of `text`), lines 1-based."""
    if text is None:
        with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
            text = handle.read()
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```\s*([\w+-]*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        markers, j = {}, i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        while j >= 0 and MARKER.match(lines[j].strip()):
            kind, reason = MARKER.match(lines[j].strip()).groups()
            markers[kind] = reason
            j -= 1
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        assert end < len(lines), f"{name}:{i + 1}: a code block that is never closed"
        blocks.append((i + 1, fence.group(1).lower(), "\n".join(lines[i + 1:end]), markers))
        i = end + 1
    return blocks


def skeleton(text):
    """A sample output's lines as they stay from run to run: every number a ``#``, a time
    spread's ``*`` flag and runs of spaces dropped, empty lines left out."""
    lines = []
    for line in text.split("\n"):
        line = re.sub(r"\d+(?:[.,]\d+)*", "#", line).replace("%*", "%")
        if line.strip():
            lines.append(" ".join(line.split()))
    return lines


def sample_mismatch(sample, output):
    """Why ``sample`` is not what ``output`` shows (None when it is), both as `skeleton` lines.

    The sample is the end of the output, line for line; a ``...`` line in it stands for any
    number of lines (the sample leaves them out), and the output may print more before it.
    """
    found = skeleton(output)
    parts, part = [], []
    for line in skeleton(sample):
        if line == "...":
            parts.append(part)
            part = []
        else:
            part.append(line)
    parts.append(part)
    position = 0
    for index, part in enumerate(parts):
        if not part:
            continue
        last = index == len(parts) - 1
        starts = [i for i in range(position, len(found) - len(part) + 1) if found[i:i + len(part)] == part]
        if last:
            starts = [i for i in starts if i + len(part) == len(found)]
        if not starts:
            where = "at the end of the output" if last else "in the output"
            near = next((i for i in range(position, len(found)) if found[i] == part[0]), None)
            shown = found[near:near + len(part)] if near is not None else found[-len(part):]
            return f"these sample lines are not {where}:\n  {part}\nthe output has:\n  {shown}"
        position = starts[0] + len(part)
    return None


def python_chains():
    """One pytest.param per chain of python blocks (a block and the continued ones after it),
    with the ``<!-- output -->`` text blocks that follow it."""
    params = []
    for name in documentation_files():
        chains = []
        for line, language, code, markers in fenced_blocks(name):
            if language != "python":
                if "output" in markers and chains:
                    chains[-1][1].append((line, code))
                continue
            if "continued" in markers and chains:
                chains[-1][0].append((line, code, markers))
            else:
                chains.append(([(line, code, markers)], []))
        for chain, outputs in chains:
            first = chain[0][0]
            code = "\n\n".join(f"# {name}:{line}\n{block}" for line, block, _ in chain)
            reasons = [markers["not-run"] or "" for _, _, markers in chain if "not-run" in markers]
            slow = any("slow" in markers for _, _, markers in chain)
            # Each example pays a fresh process (a second or two from the warm interpreter, which
            # itself imports TensorFlow once per pytest process) and its own training: only the
            # README's run in the fast suite, every other file's in CI's `slow` run.
            marks = [pytest.mark.slow] if slow or name not in FAST_FILES else []
            params.append(pytest.param(name, code, reasons[0] if reasons else None, slow, outputs,
                                       id=f"{name}:{first}", marks=marks))
    return params


@pytest.mark.parametrize("name, code, not_run, slow, outputs", python_chains())
def test_python_block_runs(name, code, not_run, slow, outputs, tmp_path):
    if not_run is not None:
        if not not_run.strip():
            pytest.fail(f"{name}: <!-- not-run --> without a reason; write <!-- not-run: why -->")
        pytest.skip(f"not run: {not_run}")
    script = tmp_path / "example.py"
    script.write_text(code + "\n", encoding="utf-8")
    timeout = SLOW_TIMEOUT_S if slow else TIMEOUT_S
    try:
        printed = run_in_fresh_process(RUNNER, [str(tmp_path), str(script)], cwd=str(tmp_path),
                                       env=example_environment(), timeout=timeout)
    except FreshProcessError as error:
        pytest.fail(f"{name}: the example failed\n{error}"[-9000:])
    for line, sample in outputs:
        mismatch = sample_mismatch(sample, printed)
        assert mismatch is None, f"{name}:{line}: the sample output is not what the example prints; {mismatch}"


def test_every_block_marker_is_known_and_every_skip_or_slow_mark_gives_a_reason():
    problems, python_blocks = [], 0
    for name in documentation_files():
        previous_python = False
        for line, language, _, markers in fenced_blocks(name):
            python_blocks += language == "python"
            for kind, reason in markers.items():
                where = f"{name}:{line}"
                if kind not in KNOWN_MARKERS:
                    problems.append(f"{where}: unknown marker <!-- {kind} -->")
                elif kind in ("slow", "not-run") and not reason:
                    problems.append(f"{where}: <!-- {kind}: reason --> needs a reason")
                elif kind in ("continued", "output") and reason:
                    problems.append(f"{where}: <!-- {kind} --> takes no reason")
                if kind == "output":
                    if language != "text" or not previous_python:
                        problems.append(f"{where}: <!-- output --> belongs on a text block after a python block")
                elif language != "python":
                    problems.append(f"{where}: <!-- {kind} --> on a {language or 'plain'} block")
                if kind == "continued" and not previous_python:
                    problems.append(f"{where}: <!-- continued --> with no python block before it")
            previous_python = previous_python or language == "python"
    assert not problems, "\n".join(problems)
    assert python_blocks >= 10  # the parser found the examples


def test_fences_name_their_language():
    """A block with no language would be neither run nor checked: output is ```text."""
    unnamed = [f"{name}:{line}" for name in documentation_files()
               for line, language, _, _ in fenced_blocks(name) if not language]
    assert not unnamed, "code blocks without a language: " + ", ".join(unnamed)


def profile_help_flags():
    """The flags ``memgrad-profile --help`` lists: its parser's help text, read in this
    process (the command itself runs in tests/cli_probe.py's fresh processes)."""
    from memgrad.cli.profile import build_parser

    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", build_parser().format_help()))


def test_memgrad_profile_flags_shown_in_the_docs_exist():
    shown = {}
    for name in documentation_files():
        for line, language, code, _ in fenced_blocks(name):
            if language == "python":
                continue
            for offset, text in enumerate(code.split("\n")):
                command = re.match(r"^\s*(?:\$\s*)?(?:memgrad-profile|python -m memgrad_profile)\b(.*)",
                                   text)
                if command:
                    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command.group(1).split("#")[0]):
                        shown.setdefault(flag, f"{name}:{line + 1 + offset}")
    assert shown, "no memgrad-profile command found in the docs"
    known = profile_help_flags()
    unknown = {flag: where for flag, where in shown.items() if flag not in known}
    assert not unknown, f"flags not in memgrad-profile --help: {unknown}"


def heading_anchors(path):
    """The anchors GitHub gives a markdown file's headings (lowercase, punctuation dropped)."""
    with open(path, encoding="utf-8") as handle:
        text = re.sub(r"```.*?```", "", handle.read(), flags=re.S)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_links_between_files_resolve():
    missing = []
    for name in documentation_files():
        with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
            text = handle.read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(name), file_part)) if file_part \
                else os.path.join(ROOT, name)
            if not os.path.exists(path):
                missing.append(f"{name}: {target}")
            elif anchor and path.endswith(".md") and anchor not in heading_anchors(path):
                missing.append(f"{name}: {target} (no such heading)")
    assert not missing, "links that do not resolve: " + ", ".join(missing)


def test_the_parser_reads_markers_and_languages():
    text = "\n".join([
        "```python", "a = 1", "```", "",
        "<!-- continued -->", "<!-- slow: trains a model -->", "```python", "b = a", "```",
        "<!-- not-run -->", "", "```bash", "memgrad-profile --top 5", "```",
        "```text", "output", "```"])
    blocks = fenced_blocks("example.md", text)
    assert [(line, language, code) for line, language, code, _ in blocks] == [
        (1, "python", "a = 1"), (7, "python", "b = a"), (12, "bash", "memgrad-profile --top 5"),
        (15, "text", "output")]
    assert blocks[1][3] == {"continued": None, "slow": "trains a model"}
    assert blocks[2][3] == {"not-run": None}  # a reason is missing: the marker test fails on it
