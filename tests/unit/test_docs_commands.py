"""Every command shown in README.md and docs/*.md works as written.

Each command in a fenced shell block (``bash``, ``sh`` or none) that starts hpcdp
(``hpcdp ...``, ``python -m hpcdp...``, under ``mpiexec``/``srun`` or not) is
checked at ``--help`` level: its (sub)command exists and its ``--help`` exits 0,
every option it uses is one that ``--help`` lists, its ``--config`` file exists and
its ``--set`` overrides are valid keys and values of that config (the config is
loaded with them). Files it names (job scripts, modules, test files) exist. The
ones that finish in seconds also RUN, exactly as written, in a scratch folder
with the repository's ``jobs/``: the one-rank digits jobs and the corpus
preparation. The README's checkpoint lines take minutes as written; they run with
a smaller GPT for fewer steps (``--set`` overrides appended) and the rest of each
line as written. Wall time: about 40 s on 2 cores.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
COMMANDS = ("train", "bench", "scale", "data", "check-exact", "ckpt", "sample", "plot")
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|\$|\bCKPT\b|\bFOLDER\b|\bPATH\b|\bFILE\b|\bDIR\b|runs/")


def shell_commands(doc: str) -> list[str]:
    """Commands in the fenced shell blocks of ``doc`` (continuation lines joined,
    a leading ``$ `` dropped), each starting a program we ship or document."""
    out, fence, lines = [], None, (ROOT / doc).read_text().splitlines()
    pending = ""
    for line in lines:
        s = line.strip()
        if s.startswith("```"):
            fence = None if fence is not None else s[3:].strip()
            continue
        if fence not in ("bash", "sh", ""):
            continue
        s = pending + s.removeprefix("$ ")
        if s.endswith("\\"):
            pending = s[:-1] + " "
            continue
        pending = ""
        if re.match(r"(mpiexec|srun|sbatch|bash|python3? -m (hpcdp|pytest))\b", s) or re.match(
                rf"hpcdp ({'|'.join(COMMANDS)}|-)", s):
            out.append(s)
    return out


ALL = [(doc, c) for doc in DOCS for c in shell_commands(doc)]


def words_of(command: str) -> list[str]:
    """The argv of the hpcdp part: launcher and trailing comment removed."""
    w = shlex.split(command, comments=True)
    if w and w[0] in ("mpiexec", "srun"):
        w = w[1:]
        while w and w[0].startswith("-") or (w and w[0].isdigit()) or (w and w[0] == "..."):
            w = w[1:]
    return w


def hpcdp_argv(words: list[str]) -> list[str] | None:
    """``hpcdp`` argv (without the program) of a command, or None if it is not one."""
    if words[:1] == ["hpcdp"]:
        return words[1:]
    if words[:2] in (["python", "-m"], ["python3", "-m"]) and words[2:3] and words[2].startswith("hpcdp"):
        module = words[2]
        if module == "hpcdp.cli":
            return words[3:]
        return ["--module", module] + words[3:]
    return None


def help_text(argv: list[str]) -> str:
    """What ``--help`` of the command in ``argv`` prints (it must exit 0)."""
    from hpcdp.cli import main

    cut = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    if argv[:1] == ["--module"]:
        import importlib

        mod = importlib.import_module(argv[1])
        call, head = (lambda: mod.main(["--help"])), []
    else:
        head = [a for a in argv[:cut] if not PLACEHOLDER.search(a)]
        # positional words after the (sub)command are arguments, not subcommands
        head = head[:2] if head[:1] in (["bench"], ["ckpt"], ["data"]) else head[:1]
        call = (lambda: main(head + ["--help"]))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            status = call()
        except SystemExit as e:
            status = e.code
    assert status in (0, None), f"{head} --help exits {status}: {buf.getvalue()[-500:]}"
    return buf.getvalue()


@pytest.mark.parametrize("doc, command", ALL, ids=[f"{d}:{c[:60]}" for d, c in ALL])
def test_each_documented_command_is_well_formed(doc, command):
    words = words_of(command)
    if words[:1] in (["bash"], ["sbatch"]):  # a script of ours: it exists
        script = next(w.rstrip(";") for w in words[1:] if w.rstrip(";").endswith((".sh", ".sbatch")))
        assert (ROOT / script).is_file(), f"{doc}: {command}: {script} is not in the repository"
        return
    if words[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        for path in words[3:]:
            assert (ROOT / path.split("::")[0]).exists(), f"{doc}: {command}: {path} is missing"
        return
    argv = hpcdp_argv(words)
    assert argv is not None, f"{doc}: {command}: not an hpcdp command"
    text = help_text(argv)
    for flag in (a.split("=")[0] for a in argv if a.startswith("--") and a != "--module"):
        assert re.search(rf"(^|[\s\[,]){re.escape(flag)}\b", text), f"{doc}: {command}: {flag} is not an option"
    config = argv[argv.index("--config") + 1] if "--config" in argv else None
    if config and config.startswith("jobs/"):  # ours; others (job.toml, c.toml) are the reader's
        assert (ROOT / config).is_file(), f"{doc}: {command}: {config} does not exist"
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    if argv[:1] == ["train"] and not any(PLACEHOLDER.search(s) for s in sets):
        from hpcdp.config import load_config

        if config is None or (ROOT / config).is_file():
            load_config(ROOT / config if config else None, sets)  # a bad key or value raises here


def _run(cwd, command: str, *extra: str, timeout=600):
    from hpcdp.launch import THREAD_ENV

    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(words_of(command) + list(extra), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture()
def scratch(tmp_path):
    (tmp_path / "jobs").symlink_to(ROOT / "jobs")
    return tmp_path


QUICK = ["hpcdp train --config jobs/digits_mlp.toml", "hpcdp train"]


@pytest.mark.parametrize("command", QUICK)
def test_quick_commands_run_as_written(scratch, command):
    assert any(c.split("#")[0].strip() == command for _, c in ALL), f"{command!r} is no longer in the docs"
    out = _run(scratch, command).stdout
    acc = float(re.findall(r"accuracy (\d\.\d+)", out)[-1])
    assert acc >= 0.9, out[-500:]  # the digits jobs' promise (>= 95% in their comments; here a margin)


def test_the_readme_checkpoint_lines_run(scratch):
    """Corpus as written; training lines as written but 6 + 2 steps of a smaller
    GPT; verify (of the first save) and sample on what they saved."""
    # the "first hour" block repeats some of these lines: each counted once
    lines = list(dict.fromkeys(c.split("#")[0].strip() for c in shell_commands("README.md")))
    prepare = next(c for c in lines if c.startswith("hpcdp data prepare"))
    # the chain that resumes (Running jobs): its folder, then the lines that use it
    pysource = [c for c in lines if "checkpoint.dir" in c and "gpt_pysource" in c]
    second = next(c for c in pysource if "--resume latest" in c)
    folder = re.search(r'checkpoint\.dir=\\"([^"\\]+)\\"', second).group(1)
    first = next(c for c in pysource if "--resume" not in c and f'checkpoint.dir=\\"{folder}\\"' in c)
    verify = next(c for c in lines if c.startswith(f"hpcdp ckpt verify {folder}/"))
    sample = next(c for c in lines if c.startswith(f"hpcdp sample --resume {folder} "))
    said = _run(scratch, prepare).stdout
    assert "wrote pysource.h5" in said
    short = ["--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "run.eval_every=0",
             "--set", "data.eval_windows=8", "--set", "sample.length=8"]
    _run(scratch, first, "--set", "train.steps=6", "--set", "checkpoint.every=3", *short)
    out = _run(scratch, second, "--set", "train.steps=8", *short).stdout
    assert f"resumed from {folder}/step-00000006" in out and "step 8/8" in re.sub(r" +", " ", out)
    verify = re.sub(r"step-\d+", "step-00000003", verify)  # the first save of the shortened run
    assert "OK " in _run(scratch, verify).stdout
    text = _run(scratch, sample).stdout
    assert text.startswith("def ") and len(text) > 4


def test_the_user_guides_print_config_and_plot_lines_run(scratch):
    """hpcdp train --print-config and the plot example, exactly as the user guide has them."""
    lines = [c.split("#")[0].strip() for c in shell_commands("docs/user-guide.md")]
    show = next(c for c in lines if "--print-config" in c)
    out = _run(scratch, show).stdout
    assert "[model]" in out and 'kind = "gpt"' in out and not (scratch / "runs").exists()
    train = next(c for c in lines if "runs/plot-demo" in c and c.startswith("hpcdp train"))
    plot = next(c for c in lines if c.startswith("hpcdp plot runs/plot-demo"))
    _run(scratch, train)
    assert "wrote runs/plot-demo/plot.png" in _run(scratch, plot).stdout
    assert (scratch / "runs" / "plot-demo" / "series.csv").read_text().count("\n") == 41


def test_the_readme_first_hour_quick_lines_run(scratch):
    """The first hour's short lines as written (the launcher dropped: one rank)."""
    block = re.search(r"## The first hour\n\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    lines = [c.split("#")[0].strip() for c in block.splitlines() if c.strip()]
    ddp = next(c for c in lines if "runs/first-ddp" in c and "train" in c)
    plot = next(c for c in lines if c.startswith("hpcdp plot"))
    _run(scratch, ddp)
    assert "wrote runs/first-ddp/plot.png" in _run(scratch, plot).stdout
    assert "bash tests/run_quick.sh" in lines and (ROOT / "tests" / "run_quick.sh").is_file()

