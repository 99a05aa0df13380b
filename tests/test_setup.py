"""Set-up a newcomer can trust: the two commands, the package lists, the CLI, the README's numbers."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]

# conda names that differ from the PyPI names
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}


def _name(req: str) -> str:
    return re.split(r"[<>=!;\[ ]", req.strip(), maxsplit=1)[0].lower()


def _env_yml_packages() -> set[str]:
    names = set()
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("dependencies:", 1)[1].splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)", line)
        if m and not line.strip().startswith("- -e") and m.group(1) != "pip:":
            names.add(CONDA_TO_PYPI.get(_name(m.group(1)), _name(m.group(1))))
    return names - NOT_PACKAGES


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {_name(d) for d in project["dependencies"]}
    test_deps = {_name(d) for d in project["optional-dependencies"]["test"]}
    pyproject = deps | test_deps
    env = _env_yml_packages()
    # triton comes through `pip -e .` with its Linux-only marker, so conda lists it nowhere
    assert env == pyproject - {"triton"}, (env ^ (pyproject - {"triton"}))
    triton = [d for d in project["dependencies"] if _name(d) == "triton"]
    assert triton and "platform_system == 'Linux'" in triton[0]
    # lower bounds, never exact pins: a student's CUDA torch must survive the install
    for dep in project["dependencies"]:
        assert "==" not in dep.split(";")[0], dep


def test_ci_calls_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\s*$", ci, re.M)
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "labsupport", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, **kw)


def test_ledger_md_numbers_match_the_ledger():
    """LEDGER.md sets Lecture 10's numbers beside what the lecture printed: it is about the lecture's card, so it is
    compared with the ledger on the lecture's model and GPU named explicitly, whatever course.toml names."""
    from labsupport.specs import LECTURE_7B, LECTURE_GPU

    ledger = (ROOT / "LEDGER.md").read_text()
    m = re.search(r"<!-- ledger:begin -->\n(.*?)\n<!-- ledger:end -->", ledger, re.S)
    assert m, "LEDGER.md lacks the generated ledger section"
    lecture = ("--model", LECTURE_7B.name, "--gpu", LECTURE_GPU.name)
    out = _run("ledger", "--markdown", *lecture)
    assert out.returncode == 0, out.stderr
    assert m.group(1).strip() == out.stdout.strip(), (
        f"LEDGER.md's numbers are stale: regenerate with `python -m labsupport ledger --markdown {' '.join(lecture)}`")
    # and the section's lead rows are the lecture's by hand: 2 x 32 x 32 x 128 x 2 B a token; 80 - 13.48 - 4 GB
    kv = 2 * LECTURE_7B.num_layers * LECTURE_7B.num_kv_heads * LECTURE_7B.head_dim * LECTURE_7B.dtype_bytes
    budget = LECTURE_GPU.hbm_bytes - LECTURE_7B.num_params * LECTURE_7B.dtype_bytes - 4e9
    naive, paged = int(budget // (4096 * kv)), int(budget // (16 * kv)) // 40  # 29 slots; 7,452 blocks // 40 = 186
    assert (kv, naive, paged) == (524_288, 29, 186)
    assert f"| KV bytes per token | {kv:,} B (512 KiB) |" in m.group(1)
    assert f"| Concurrency: naive -> paged | {naive} -> {paged} " in m.group(1)


GUIDES = ("README.md", "LEDGER.md", "GRADING.md", "COURSE_AUTHORING.md", "INSTRUCTORS.md", "labsupport/README.md")


def test_every_link_in_the_guides_leads_somewhere():
    """A relative link in any guide names a file or folder of the repository."""
    for guide in GUIDES:
        path = ROOT / guide
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
        assert targets, guide
        for target in targets:
            if "://" not in target:
                assert (path.parent / target).exists(), f"{guide} links to {target}, which does not exist"


def test_the_readme_reads_in_five_minutes_and_points_at_the_guides():
    readme = (ROOT / "README.md").read_text()
    # reading prose at about 250 words a minute; the lab table is scanned, not read, so it is left out
    prose = [line for line in readme.splitlines() if not line.startswith("|")]
    assert len(" ".join(prose).split()) <= 1300
    for guide in ("LEDGER.md", "GRADING.md", "INSTRUCTORS.md"):
        assert f"]({guide})" in readme, guide
    assert "<!-- ledger:begin -->" not in readme  # the tables live in LEDGER.md
    for section in ("## Set-up", "## The labs", "## CPU-only mode, GPUs and Colab", "## Where to go next"):
        assert section in readme, section


def test_ledger_cli_json_keys_and_values():
    out = _run("ledger", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    for key in ("kv_bytes_per_token kv_budget_bytes naive_slot_bytes naive_concurrency naive_utilization "
                "paged_concurrency paged_utilization block_table_entries block_table_bytes fanout_tokens_unshared "
                "fanout_tokens_shared fanout_factor swap_round_trip_s recompute_flops recompute_s breakeven_link_gbs "
                "crossover_tokens tpot_s throughput_tok_s max_batch_for_slo ridge_batch").split():
        assert key in r, key
    # no flags: the course card's model and GPU (the subprocess reads the same course.toml), by hand on its fields;
    # the lecture's card gives 524,288 B and 29 slots of 4,096 tokens
    from labsupport import card

    m, g = card.card().model, card.card().gpu
    kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes
    assert r["kv_bytes_per_token"] == kv
    assert r["naive_concurrency"] == int((g.hbm_bytes - m.num_params * m.dtype_bytes - 4e9) // (4096 * kv))
    # explicit shape flags override the card's model: 16 layers, 32 heads and 8 KV heads (the heads named too, as
    # 8 KV heads cannot serve every card's heads: Qwen2.5-7B has 28), its head size and bytes per value
    out = _run("ledger", "--json", "--layers", "16", "--heads", "32", "--kv-heads", "8", "--link-gbs", "32",
               "--s-max", "2048")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    kv = 2 * 16 * 8 * m.head_dim * m.dtype_bytes  # 65,536 B on either card (head size 128, 2 B)
    assert r["kv_bytes_per_token"] == kv
    assert r["naive_slot_bytes"] == 2048 * kv
    assert r["swap_round_trip_s"] == pytest.approx(2 * 2048 * kv / 32e9)


@pytest.mark.parametrize("flags, needle", [
    (["--block-size", "0"], "--block-size"),
    (["--s-max", "-5"], "--s-max"),
    (["--gpu", "rtx9999"], "unknown GPU"),
    (["--model", "gpt-9"], "unknown model"),
    (["--kv-budget-gb", "0.000001"], "smaller than one block"),
    (["--hbm-gb", "10"], "weights alone"),
    (["--mfu", "2"], "--mfu"),
    (["--prompt", "abc"], "--prompt: expected an integer"),
    (["--heads", "32", "--kv-heads", "5"], "multiple of"),  # heads named: the card's need not be a multiple of 5
])
def test_ledger_cli_bad_flags(flags, needle):
    out = _run("ledger", *flags)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_unknown_command_and_usage():
    assert _run("frobnicate").returncode == 2
    out = _run("--help")
    assert out.returncode == 0 and "ledger" in out.stdout


@pytest.mark.slow  # a subprocess that imports everything
def test_doctor_reports_cpu_mode():
    out = _run("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: the labs can run here." in out.stdout
    import torch
    if not torch.cuda.is_available():
        assert "interpreter" in out.stdout


@pytest.mark.slow  # a fresh interpreter
def test_triton_interpret_is_set_before_triton_import():
    code = ("import os, sys; import labsupport; import torch; "
            "assert torch.cuda.is_available() or os.environ.get('TRITON_INTERPRET') == '1'; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("platform, files, no_gpu", [
    ("linux", set(), True),  # a laptop, CI, Colab without a GPU: torch is not imported to learn it
    ("linux", {"/dev/nvidiactl", "/dev/nvidia0"}, False),  # NVIDIA's driver (also a container given a GPU)
    ("linux", {"/dev/dxg"}, False),  # WSL 2 with a GPU
    ("linux", {"/dev/kfd"}, False),  # ROCm, which torch.cuda also serves
    ("darwin", set(), True),  # no CUDA on macOS
    ("win32", set(), False),  # no device files to read: torch decides
])
def test_a_machine_without_a_gpu_is_known_without_importing_torch(monkeypatch, platform, files, no_gpu):
    import labsupport

    monkeypatch.setattr(labsupport.sys, "platform", platform)
    monkeypatch.setattr(labsupport.os.path, "exists", lambda p: p in files)
    assert labsupport.no_gpu_here() is no_gpu


@pytest.mark.slow  # a fresh interpreter
def test_import_labsupport_leaves_torch_unimported_on_a_machine_without_a_gpu():
    """Most of a lab (the allocators, the engine, the ledger, the charts) never needs torch; a kernel that imports
    labsupport starts 1.4 CPU-seconds sooner without it, and grading starts one such process per notebook."""
    code = ("import os, sys; import labsupport; "
            "print(sorted({'torch', 'triton'} & set(sys.modules)), os.environ['TRITON_INTERPRET'])")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    import labsupport
    if not labsupport.no_gpu_here():
        pytest.skip("a GPU's device file is here: torch decides, as it should")
    assert out.returncode == 0 and out.stdout.split() == ["[]", "1"], out.stdout + out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_jupyterlab():
    if not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("make lab needs the venv that `make test` creates")
    port = _free_port()
    args = (f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token= --ServerApp.password= "
            "--ServerApp.open_browser=False")
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        status = None
        while time.time() < deadline and status != 200:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=5) as resp:
                    status = resp.status
            except OSError:
                time.sleep(0.5)
        assert status == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
