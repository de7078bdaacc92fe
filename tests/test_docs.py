"""README.md and docs/DESIGN.md against the code they describe: every command they show (and every one campaign.sh,
pairs/smol.sh and bench/device.sh run) passes only flags its script has, every flag they name in prose exists
somewhere, every file the README's tree names is there, and every script and library module is in that tree. A
renamed flag or a moved file fails here rather than in a reader's terminal.

A stage's flags are read from the usage lines of its own `--help` (the parser as it runs, shared flags from lib/
included); a bench script's from the option strings in its source (some import CUDA-only code, so they are not
run)."""
import re
import subprocess
import sys

import pytest

from helpers import REPO

DOCS = ("README.md", "docs/DESIGN.md")
SCRIPTS = ("campaign.sh", "pairs/smol.sh", "bench/device.sh")              # what they run, read the same way
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# flags of the other tools the docs run (pip, pytest-xdist, torchrun), named here one by one
EXTERNAL = {"--index-url", "--extra-index-url", "--no-deps",
            "--dist", "--no-loadscope-reorder",
            "--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint", "--standalone"}


@pytest.fixture(scope="module")
def flags() -> dict[str, set[str]]:
    """Script path (as the docs write it) → the flags it accepts."""
    stages = sorted(p.name for p in REPO.glob("0[1-7]_*.py"))
    procs = {s: subprocess.Popen([sys.executable, s, "--help"], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for s in stages}
    out = {}
    for s, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, f"{s} --help failed: {stderr[-2000:]}"
        out[s] = set(FLAG.findall(stdout.split("\n\n", 1)[0])) | {"--help"}   # the usage lines: options, not prose
    for p in sorted(REPO.glob("bench/*.py")):
        out[f"bench/{p.name}"] = set(re.findall(r"""["'](--[a-z][a-z0-9-]*)""", p.read_text()))
    assert len(stages) == 7 and all("--run-dir" in out[s] for s in stages)
    return out


def shell_commands(text: str):
    """The lines of a shell script, backslash continuations joined, comments dropped."""
    joined = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        line = line.split(" # ")[0].rstrip()
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        yield joined + line
        joined = ""


def code_commands(text: str):
    """The shell lines of a document's ```-fenced blocks, and every `inline` span that runs python or torchrun."""
    fenced, lines = False, []
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line)
    yield from shell_commands("\n".join(lines))
    yield from re.findall(r"`([^`\n]*\b(?:python3?|torchrun)\b[^`\n]*)`", text)


def script_calls(command: str):
    """(script, the flags after it) for each python/torchrun call in one shell line. Quoted arguments are left out:
    they carry another script's flags (bench/collapse_fixes.py --conditions "raw:--lr 5e-4")."""
    for part in re.split(r"\|\||&&|;|\|", command):
        m = re.search(r"\b(?:python3?|torchrun)\b.*?((?:bench/)?\w+\.py)\b(.*)", part)
        if m:
            yield m.group(1), FLAG.findall(re.sub(r"\"[^\"]*\"|'[^']*'", "", m.group(2)))


@pytest.mark.parametrize("doc", DOCS + SCRIPTS)
def test_every_command_the_docs_show_passes_flags_its_script_has(doc, flags):
    lines = (shell_commands if doc.endswith(".sh") else code_commands)((REPO / doc).read_text())
    calls = [c for line in lines for c in script_calls(line)]
    assert calls, f"{doc}: no command found (the parser above went blind)"
    unknown = sorted({s for s, _ in calls} - set(flags))
    assert not unknown, f"{doc} runs scripts that are not here: {unknown}"
    bad = sorted({(s, f) for s, fs in calls for f in fs if f not in flags[s]})
    assert not bad, f"{doc} passes flags its scripts do not have: {bad}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_flag_the_docs_name_exists(doc, flags):
    known = set().union(*flags.values()) | EXTERNAL
    named = set(FLAG.findall((REPO / doc).read_text()))
    assert len(named) > 20
    assert not named - known, f"{doc} names flags no script has: {sorted(named - known)}"


def readme_tree() -> set[str]:
    """The paths README.md's file tree names: an entry is the first word of a line indented by 0, 2, 4 … spaces, a
    folder (ending in /) holds the deeper entries below it; `; name: …` in a description names a sibling."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Files", 1)[1].split("```", 2)[1]
    parents: list[str] = []
    names = set()
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent > 8:                     # a description's continuation line
            continue
        parents = parents[:indent // 2]
        name, _, description = line.strip().partition(" ")
        prefix = "".join(parents)
        names.add(prefix + name)
        names |= {prefix + sibling for sibling in re.findall(r"; ([\w./]+): ", description)}
        if name.endswith("/"):
            parents.append(name)
    return names


def test_the_readme_tree_names_files_that_exist():
    names = readme_tree()
    assert {"03_opd_train.py", "lib/sample/decode.py", "lib/train/sft_fsdp.py", "bench/device.sh"} <= names
    missing = sorted(n for n in names if not (REPO / n.rstrip("/")).exists())
    assert not missing, f"README.md's tree names paths that are not here: {missing}"


def test_every_script_and_module_is_in_the_readme_tree():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    wanted = [p for p in tracked
              if re.fullmatch(r"[^/]+\.(py|sh)|lib/.+\.py|bench/[^/]+\.(py|sh)", p) and not p.endswith("__init__.py")]
    names = readme_tree()
    absent = sorted(p for p in wanted if p not in names)
    assert not absent, f"README.md's tree (## Files) lacks these, one line each: {absent}"
