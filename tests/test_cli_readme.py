"""The README's shell and Python blocks, executed in their quick form, so the README cannot drift from the code.

Every command line of every ```sh block must appear in QUICK below: run as written (in a scratch folder with a real
photograph as `photo.jpg`), a set-up line, run in a named quick form, or skipped with the reason. A README line missing
here fails `test_every_readme_command_is_covered`; every line, set-up and pip lines included, must parse against what
it names (a make target, a CLI command and its options, a file) in the fast `test_every_readme_line_parses`; a covered
command that stops working fails its own case. `test_readme_in_a_fresh_clone` (slow) runs the blocks as a new user
types them: a fresh clone, the set-up lines, `source .venv/bin/activate`, then every as-written command in one shell.
"""
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
PHOTO_LINE = ("python -c \"from PIL import Image; from forensicslab.data.photos import photo; "
              "Image.fromarray(photo('coffee')).save('photo.jpg')\"")
BIN = Path(sys.executable).parent
AS_IS, SETUP, SLOW, SKIP = "as written", "set-up", "slow", "skip"

# README command -> (how, quick form or reason). `{tmp}` is the scratch folder.
QUICK = {
    "make demo": (SETUP, "make install"),   # the fresh-clone test runs its set-up part; the reproduction is the lead's fresh-clone run
    "make reproduce": (SKIP, "the full profiles take hours; tests/test_studies.py checks profiles, resuming, --list and the ETA lines"),
    "source .venv/bin/activate": (SETUP, None),
    PHOTO_LINE: (SETUP, None),
    "forensicslab --version": (AS_IS, None),
    "make test": (SKIP, "this test suite itself"),
    "make lab": (SKIP, "checked by tests/test_course_lab.py (JupyterLab in headless Chromium)"),
    "make site": (SKIP, "checked by tests/test_course_site.py (site built and loaded in headless Chromium)"),
    "forensicslab study": (AS_IS, None),
    "forensicslab study triage_table4 --params": (AS_IS, None),
    "forensicslab study triage_table4 --quick": (SLOW, "forensicslab study triage_table4 --quick -p n_boot 50"),
    'forensicslab study triage_table4 -p backbone "openai:gpt-4o" -y collections "[ood]" -p seed 1':
        (SLOW, 'forensicslab study triage_table4 --quick -p backbone "" -y collections "[ood]" -p seed 1 -p n_boot 50'),
    'papermill nbs/studies/triage_table4.ipynb out.ipynb -p quick True -y "collections: [ood]"':
        (SLOW, 'papermill nbs/studies/triage_table4.ipynb {tmp}/out.ipynb -p quick True -y "collections: [ood]" -p n_boot 50'),
    "forensicslab batch grids/triage_table4_quick_seeds.yaml": (SLOW, None),
    "forensicslab batch grids/triage_table4_backbones.yaml": (SKIP, "needs an OpenAI key and a Gemma server; its grid is checked by tests/test_cli_batch.py"),
    "forensicslab --help": (AS_IS, None),
    "forensicslab analyze photo.jpg": (AS_IS, None),
    "forensicslab analyze photo.jpg --config rules": (AS_IS, None),
    "forensicslab detect photo.jpg": (AS_IS, None),
    "forensicslab detect photo.jpg --panels panels": (AS_IS, None),
    "forensicslab detect --list": (AS_IS, None),
    "forensicslab zoom photo.jpg": (AS_IS, None),
    'forensicslab debate pair photo.jpg "A caption about the photo" --retrieval teaching': (AS_IS, None),
    "forensicslab bench info": (AS_IS, None),
    "forensicslab models prices": (AS_IS, None),
    "forensicslab models cache-info": (AS_IS, None),
    "forensicslab reproduce --quick --only triage_table4": (SLOW, "forensicslab reproduce --quick --only triage_table4 -p n_boot 50"),
}
# commands whose "as written" result on a fresh clone is a one-line notice with exit 1 (nothing built or cached yet)
MAY_BE_EMPTY = {"forensicslab bench info", "forensicslab models cache-info"}


def shell_lines(text: str = README) -> list[str]:
    "Command lines of the ```sh blocks: comments dropped, backslash continuations joined."
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            cmd = line.split("  #")[0].split(" # ")[0].strip()
            if cmd and not cmd.startswith("#"): out.append(re.sub(r"\s+", " ", cmd))
    return out


def pip_lines() -> list[str]:
    return [l for l in shell_lines() if l.startswith("pip install")]


def test_every_readme_command_is_covered():
    missing = [l for l in shell_lines() if l not in QUICK and not l.startswith("pip install")]
    assert not missing, f"README commands with no quick form in tests/test_cli_readme.py: {missing}"
    stale = [k for k in QUICK if k not in shell_lines()]
    assert not stale, f"QUICK entries the README no longer has: {stale}"


def test_readme_extras_exist():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = [m.group(1) for l in pip_lines() if (m := re.search(r'\.\[([a-z-]+)\]', l))]
    assert named and all(n in extras for n in named), (named, sorted(extras))
    assert set(extras) <= set(named), f"extras the README does not document: {set(extras) - set(named)}"
    assert "pip install ." in pip_lines(), "the README shows no plain install"
    for l in pip_lines():
        if " -c " in l: assert (REPO / l.split(" -c ")[1].split()[0]).is_file(), l


def _cli_parse(argv: list[str]) -> str:
    "Parse a `forensicslab` command line against the CLI (no command runs); returns the command's name or raises."
    import contextlib
    import io
    import typer
    from forensicslab.cli import app
    def parse(cmd, args, name):
        ctx = cmd.make_context(name, list(args))
        if not hasattr(cmd, "resolve_command"): return name
        rest = [*(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or []), *ctx.args]
        if not rest: return name
        sub_name, sub, sub_args = cmd.resolve_command(ctx, rest)
        return parse(sub, sub_args, sub_name)
    try:
        with contextlib.redirect_stdout(io.StringIO()): return parse(typer.main.get_command(app), argv, "forensicslab")
    except Exception as e:
        if type(e).__name__ == "Exit" and getattr(e, "exit_code", 1) == 0: return "forensicslab"   # --help, --version
        raise AssertionError(f"forensicslab {shlex.join(argv)}: {e.format_message() if hasattr(e, 'format_message') else e}")


def test_every_readme_line_parses(tmp_path):
    "Fast: each line of each sh block names something that exists, and its options parse (nothing slow runs)."
    makefile = (REPO / "Makefile").read_text()
    for line in shell_lines():
        argv = shlex.split(line)
        if argv[0] == "make":
            assert all(re.search(rf"^{re.escape(t)}:", makefile, re.M) for t in argv[1:]), f"{line}: no such make target"
        elif argv[0] == "source":
            assert argv[1:] == [".venv/bin/activate"] and "VENV := .venv" in makefile and "-m venv $(VENV)" in makefile, line
            assert "source $(VENV)/bin/activate" in makefile, "make does not print the activation line"
        elif argv[0] == "forensicslab":
            _cli_parse(argv[1:])
        elif argv[0] == "papermill":
            assert (REPO / argv[1]).is_file() and (BIN / "papermill").exists(), line
        elif argv[0] == "python":
            assert argv[1] == "-c", line
            r = subprocess.run([sys.executable, "-c", argv[2]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"{line}: {r.stderr[-1500:]}"
        elif argv[0] == "pip":
            assert argv[1] == "install" and (REPO / "pyproject.toml").is_file(), line
        else:
            raise AssertionError(f"README line with no check: {line}")
    assert (tmp_path / "photo.jpg").is_file(), "the README's photo line wrote no photo.jpg"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    "A folder outside the checkout holding a real photograph as photo.jpg."
    d = tmp_path_factory.mktemp("readme")
    from PIL import Image
    from forensicslab.data.photos import photo
    Image.fromarray(photo("coffee")).save(d / "photo.jpg", quality=92)
    return d


def _run(cmd: str, cwd: Path, tmp: Path, timeout: int = 900):
    argv = shlex.split(cmd.format(tmp=tmp))
    exe = BIN / argv[0]
    if not exe.exists(): pytest.skip(f"{argv[0]} not installed in this environment")
    env = {**os.environ, "FORENSICSLAB_BENCH": os.environ.get("FORENSICSLAB_BENCH", str(REPO / "data" / "bench"))}
    return subprocess.run([str(exe), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _check(cmd, r):
    out = r.stdout + r.stderr
    assert "Traceback" not in out, f"{cmd}: traceback\n{out[-3000:]}"
    if cmd in MAY_BE_EMPTY and r.returncode == 1:
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error:") or "no " in r.stderr, out
        return
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{out[-3000:]}"


FAST = [k for k, (how, _) in QUICK.items() if how == AS_IS]
SLOW_CASES = [k for k, (how, _) in QUICK.items() if how == SLOW]


class _Result:
    def __init__(self, returncode, stdout, stderr): self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _run_in_process(cmd: str, cwd: Path, capsys, monkeypatch) -> _Result:
    "The console script's `main` in this process (same code path, without paying the imports per command)."
    import forensicslab.cli as cli
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = 0
    try: cli.main(shlex.split(cmd)[1:])
    except SystemExit as e: code = e.code or 0
    out = capsys.readouterr()
    return _Result(code, out.out, out.err)


@pytest.mark.parametrize("cmd", FAST)
def test_readme_command_runs_as_written(cmd, scratch, capsys, monkeypatch):
    image_cmd = "photo.jpg" in cmd
    r = _run_in_process(cmd, scratch if image_cmd else REPO, capsys, monkeypatch)
    _check(cmd, r)
    if "--panels panels" in cmd:
        assert list((scratch / "panels").glob("*.png")), "detect --panels wrote no panel"
    if cmd.startswith("forensicslab analyze photo.jpg"):   # the report in the output folder, one per configuration
        assert list((scratch / "forensicslab-analyze").glob("*/photo.triage.html")) and "verdict:" in r.stdout
        assert not (scratch / "photo.triage.html").exists(), "analyze wrote beside the input"


def test_image_commands_leave_no_cache_in_the_current_folder(tmp_path):
    "Issue 17 item 11: outside a checkout, analyze/debate cache in the user cache folder, not ./data or ./.cache."
    from PIL import Image
    from forensicslab.data.photos import photo
    Image.fromarray(photo("chelsea")).save(tmp_path / "photo.jpg", quality=92)
    for cmd in ("forensicslab analyze photo.jpg", 'forensicslab debate pair photo.jpg "A caption about the photo" --retrieval teaching'):
        _check(cmd, _run(cmd, tmp_path, tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forensicslab-analyze", "photo.jpg"]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", SLOW_CASES)
def test_readme_command_quick_form(cmd, tmp_path):
    quick = QUICK[cmd][1] or cmd
    before = subprocess.run(["git", "status", "--porcelain", "outputs"], cwd=REPO, capture_output=True, text=True).stdout
    _check(cmd, _run(quick, REPO, tmp_path, timeout=1800))
    after = subprocess.run(["git", "status", "--porcelain", "outputs"], cwd=REPO, capture_output=True, text=True).stdout
    assert after == before, "a quick run changed the committed reference outputs"


@pytest.mark.slow
def test_readme_in_a_fresh_clone(tmp_path):
    """Issue 24 item 3: the README as a new user meets it. A fresh clone of the committed tree, its set-up lines
    (`make install`, the set-up part of `make demo`; `source .venv/bin/activate`; the photo line), then every
    as-written command, typed into one bash shell as in the README, each with its exit status checked."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=600)
    steps = []
    for line in shell_lines():
        how, alt = QUICK.get(line, (SKIP, "pip line: .ci/run checks `pip install .` in a clean venv"))
        if how in (SETUP, AS_IS): steps.append((line, alt or line))
    script = "cd " + shlex.quote(str(clone)) + "\n" + "".join(
        f"echo '@@ {i}'; {cmd}; echo \"@@rc $?\"\n" for i, (_, cmd) in enumerate(steps))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "FORENSICSLAB_BENCH")}
    env.update(FORENSICSLAB_CACHE_DIR=str(tmp_path / "cache"), PATH=os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO))))
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=3600, env=env)
    out = r.stdout + r.stderr
    codes = [int(c) for c in re.findall(r"^@@rc (\d+)$", r.stdout, re.M)]
    assert len(codes) == len(steps), out[-4000:]
    for (line, _), code in zip(steps, codes):
        ok = code == 0 or (code == 1 and line in MAY_BE_EMPTY)
        assert ok, f"README line failed in a fresh clone (exit {code}): {line}\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
    assert list((clone / "forensicslab-analyze").glob("*/photo.triage.html"))


def test_readme_python_blocks_run(tmp_path):
    "The Python snippets of the README (those not rendered from executed index cells) run as written."
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    snippets = [textwrap_dedent(b) for b in blocks]
    assert snippets
    for i, code in enumerate(snippets):
        r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"README python block {i}:\n{code}\n{r.stderr[-2000:]}"


def textwrap_dedent(s: str) -> str:
    import textwrap
    return textwrap.dedent(s)


def test_readme_benchmark_counts_match_the_code():
    "Issue 24: the README said the ood collection had 200 images while the code built 270. Every `coll`: N in the README is asked of the spec."
    from forensicslab.data.bench import COLLECTIONS, BenchSizes, _plan
    plan = {c: _plan(c, BenchSizes()) for c in COLLECTIONS}
    said = re.findall(r"`(train|id|ood)`: (\d+)(?: images)?(?: \((\d+) manipulated)?", README)
    assert {c for c, *_ in said} == set(COLLECTIONS), said
    for coll, n, fake in said:
        assert int(n) == len(plan[coll]), f"README: {coll} has {n} images; the code builds {len(plan[coll])}"
        if fake: assert int(fake) == sum(label for _, label, _ in plan[coll]), (coll, fake)
