"""Every command against random flags and random trace files: the one rule holds whatever the input.

For any argv: the exit code is 0 or 2; nothing prints a traceback; a refusal (2) is exactly one line on
stderr and nothing on stdout; and whatever `--json` prints is strict JSON (NaN and Infinity refused).
Commands run in-process through `python -m labsupport`'s own `main`, so a hundred examples cost seconds.

To cover another command, add one line to COMMANDS: its name after `python -m labsupport`, a strategy
for its argv (`flags(...)` builds one from each flag's valid and hostile values), and an example count.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import labsupport  # noqa: F401  (TRITON_INTERPRET before triton)
from labsupport.__main__ import main as labsupport_main
from labsupport.cli import train_tiny
from labsupport.specs import GPUS, MODELS
from labsupport.workloads import TRACES

# --- values ---------------------------------------------------------------------------------------

# What a hostile user types where a number belongs: not numbers, non-finite, out of every range,
# other scripts' digits, Python literals argparse's int() and float() would take, huge and empty.
HOSTILE = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e-320", "-0", "0", "-1", "",
                     " ", "abc", "True", "False", "None", "١٢", "１２", "²", "1_000", "0x10", "1e3", "+5", "--json",
                     "9" * 50, "9" * 5000, "1" + "0" * 400, "0.5.1", "5\n", "\x00", "\udcff", "-", "1e"]),
    st.integers(-(10**40), 10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)


def ints(lo: int, hi: int) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi)).map(str)


def reals(lo: float, hi: float) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from([lo, hi]), st.floats(lo, hi)).map(repr)


def flags(valued: dict[str, st.SearchStrategy[str]], switches: tuple[str, ...] = (), positional=st.nothing(),
          max_flags: int = 5) -> st.SearchStrategy[list[str]]:
    """argv of a few flags, each with a valid value (its strategy) or a hostile one, plus switches and junk."""
    def pair(flag):
        return st.tuples(st.just(flag), st.one_of(valued[flag], valued[flag], HOSTILE)).map(list)

    items = st.one_of(*(pair(f) for f in valued), st.sampled_from(switches or ("--help",)).map(lambda s: [s]),
                      st.sampled_from(["--bogus", "-x", "--", "extra"]).map(lambda s: [s]),
                      positional.map(lambda s: [s]))
    return st.lists(items, max_size=max_flags).map(lambda xs: [a for x in xs for a in x])


OUTPUT = st.sampled_from([["--json"], ["--json"], []])  # the text report, or strict JSON most of the time

# --- ledger -----------------------------------------------------------------------------------------

TOKENS_MAX = 2**31 - 1
LEDGER = flags({
    "--model": st.sampled_from(sorted(MODELS) + ["gpt-9", ""]), "--gpu": st.sampled_from(sorted(GPUS) + ["b200x"]),
    "--layers": ints(1, 4096), "--heads": ints(1, 65_536), "--kv-heads": st.sampled_from(["1", "2", "8", "32", "5"]),
    "--head-dim": ints(1, 65_536), "--params": reals(1.0, 1e15), "--dtype-bytes": ints(1, 8),
    "--hbm-gb": reals(1e-3, 1e9), "--bandwidth-gbs": reals(1e-3, 1e9), "--peak-tflops": reals(1e-6, 1e9),
    "--mfu": reals(1e-3, 1.0), "--kv-budget-gb": reals(1e-9, 1e9), "--prompt": ints(1, TOKENS_MAX),
    "--output": ints(0, TOKENS_MAX), "--s-max": ints(1, TOKENS_MAX), "--block-size": ints(1, TOKENS_MAX),
    "--link-gbs": reals(1e-3, 1e9), "--tpot-slo-ms": reals(1e-6, 1e9), "--fanout-n": ints(1, 1 << 20),
    "--fanout-prompt": ints(0, TOKENS_MAX), "--fanout-output": ints(0, TOKENS_MAX),
}, switches=("--json", "--markdown"), max_flags=8)

# --- simulate: small valid runs, and random trace files ----------------------------------------------

_TS = "2023-11-16 18:15:{:02d}.{}"
CSV_ROW = st.one_of(
    st.tuples(st.integers(0, 59), st.integers(0, 999_999), st.integers(1, 3000), st.integers(1, 200)).map(
        lambda t: f"{_TS.format(t[0], t[1])},{t[2]},{t[3]}"),  # a valid row
    st.tuples(st.integers(0, 59), HOSTILE, HOSTILE).map(lambda t: f"{_TS.format(t[0], 1)},{t[1]},{t[2]}"),
    st.sampled_from([f"{_TS.format(1, 1)},{2**63},5", f"{_TS.format(1, 1)},5", "yesterday,5,5", ",,",
                     f"{_TS.format(1, 1)},5,5,5", f'"{_TS.format(1, 1)},5,5', f"{_TS.format(1, 1)}," + "7" * 140_000
                     + ",5", f"{_TS.format(1, 1)},١٢,5", "٢٠٢٣-11-16 18:15:01.1,5,5", f"{_TS.format(1, 1)},5,\x00"]),
)
CSV_HEADER = st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens", "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens",
                              "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens", "time,prompt,out", ""])
MOON_ROW = st.one_of(
    st.tuples(st.integers(0, 10**7), st.integers(1, 3000), st.integers(1, 200)).map(
        lambda t: json.dumps({"timestamp": t[0], "input_length": t[1], "output_length": t[2],
                              "hash_ids": list(range(-(-t[1] // 512)))})),
    st.sampled_from(['{"timestamp": NaN, "input_length": 5, "output_length": 3, "hash_ids": [1]}',
                     '{"timestamp": ' + "9" * 400 + ', "input_length": 5, "output_length": 3, "hash_ids": [1]}',
                     "[" * 5000 + "]" * 5000, '{"timestamp": 1, "input_length": "5", "output_length": 3, "hash_ids": [1]}',
                     '{"timestamp": 1, "input_length": 5, "input_length": 6, "output_length": 3, "hash_ids": [1]}',
                     '{"timestamp": 1, "input_length": ' + "1" * 5000 + ', "output_length": 3, "hash_ids": [1]}',
                     "{not json", "null", "[]", '"x"', '{"timestamp": true, "input_length": 5, "output_length": 3}']),
    HOSTILE,
)


@st.composite
def trace_file(draw) -> list[str]:
    """['--trace', name, '--trace-file', path] for a random Azure CSV or Mooncake JSONL file (BOMs, bad bytes too)."""
    if draw(st.booleans()):
        lines = [draw(CSV_HEADER)] + draw(st.lists(CSV_ROW, max_size=8))
        name, suffix = "azure-conv", ".csv"
    else:
        lines = draw(st.lists(MOON_ROW, max_size=8))
        name, suffix = "mooncake-conv", ".jsonl"
    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    data = draw(st.sampled_from([data, data, b"\xff\xfe" + data, data.replace(b"5", b"\xff", 1)]))
    f = tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False, dir=_TMP)
    with f:
        f.write(data)
    return ["--trace", name, "--trace-file", f.name]


_TMP = tempfile.mkdtemp(prefix="labsupport-properties-")
SIMULATE_FLAGS = {
    "--limit": ints(1, 30), "--rate-scale": reals(1e-6, 1e6), "--model": st.sampled_from(sorted(MODELS)),
    "--gpu": st.sampled_from(sorted(GPUS)), "--block-size": st.sampled_from(["1", "16", "256", str(TOKENS_MAX)]),
    "--kv-budget-gb": reals(1e-9, 1e9), "--watermark": reals(0.0, 0.999), "--preemption":
        st.sampled_from(["auto", "swap", "recompute", "evict"]), "--max-num-seqs": ints(1, 64),
    "--max-num-batched-tokens": ints(1, TOKENS_MAX), "--mfu": reals(1e-3, 1.0), "--link-gbs": reals(1e-3, 1e9),
    "--ttft-slo-ms": reals(1e-6, 1e12), "--tpot-slo-ms": reals(1e-6, 1e12), "--synthetic-requests": ints(1, 20),
    "--synthetic-rate": reals(1e-6, 1e9), "--synthetic-prompt": ints(1, 3000),
    "--synthetic-output": st.sampled_from(["1", "2", "64"]), "--seed": ints(0, 2**63 - 1),
    "--bad-rows": st.sampled_from(["reject", "skip", "maybe"]),
}
SIMULATE = st.tuples(
    st.one_of(trace_file(), st.just(["--trace", "synthetic", "--synthetic-requests", "12"])),
    flags(SIMULATE_FLAGS, switches=("--json", "--progress")),
    OUTPUT,
).map(lambda t: t[0] + t[1] + t[2])

# --- bench, doctor, and what is not a command --------------------------------------------------------

BENCH = st.one_of(
    st.tuples(st.just(["bench", "engine", "--profile-requests", "0"]),
              flags({"--limit": ints(1, 30), "--trace": st.sampled_from(["azure-conv", "azure-code", "x"]),
                     "--profile-requests": ints(0, 20)}, max_flags=3)).map(lambda t: t[0] + t[1] + ["--limit", "20"]),
    st.tuples(st.sampled_from(["allocator", "viz", "viz_memory", "viz_slo", "kernel", "gpu", "notebooks"]),
              flags({"--seconds": HOSTILE, "--block-size": HOSTILE, "--num-blocks": HOSTILE, "--batch": HOSTILE,
                     "--repeats": HOSTILE, "--kv-heads": HOSTILE, "--tile-tokens": HOSTILE, "--budget-s": HOSTILE,
                     "--workers": HOSTILE}, max_flags=2).filter(bool))
      .map(lambda t: ["bench", t[0], *t[1]]),  # at least one hostile flag: refused fast
    st.tuples(st.just("bench"), st.one_of(HOSTILE, st.just(""))).map(list),
)
DOCTOR = flags({}, switches=("--json",), positional=st.sampled_from(["--bogus", "x"])).map(lambda a: ["doctor", *a])
TRACES_ARGV = flags({}, switches=("--list", "--list", "--help"), max_flags=3,
                    positional=st.one_of(st.sampled_from(sorted(TRACES)), HOSTILE)).map(lambda a: ["traces", *a])
NOT_A_COMMAND = st.one_of(HOSTILE, st.sampled_from(["-h", "--help", "LEDGER", " ledger"])).map(lambda c: [c])


def _train_tiny_argv() -> st.SearchStrategy[list[str]]:
    """train_tiny with random flags, always writing to a scratch file (never the shipped weights)."""
    corpus = Path(_TMP) / "corpus.txt"
    corpus.write_text("The block table maps logical blocks to physical blocks. " * 40)
    valued = {"--steps": ints(1, 2), "--batch": ints(1, 4), "--seq-len": ints(2, 16), "--lr": reals(1e-4, 1e-2),
              "--seed": ints(0, 2**63 - 1), "--threads": ints(1, 2), "--max-minutes": reals(0.01, 1.0)}
    safe = ["--corpus", str(corpus), "--out", str(Path(_TMP) / "tiny.pt")]
    return st.tuples(flags(valued, max_flags=3), st.sampled_from([[], ["--corpus", _TMP], ["--corpus", "/nonexistent"]]))\
        .map(lambda t: ["--steps", "1", "--seq-len", "8", *t[0], *safe, *t[1]])


@dataclass(frozen=True)
class Command:
    name: str  # for the test id
    argv: st.SearchStrategy  # full argv after `python -m labsupport` (or after `main`'s module)
    examples: int
    main: object = labsupport_main


COMMANDS = [
    Command("ledger", st.tuples(LEDGER, OUTPUT).map(lambda t: ["ledger", *t[0], *t[1]]), 200),
    Command("simulate", SIMULATE.map(lambda a: ["simulate", *a]), 60),
    Command("bench", BENCH, 30),
    Command("doctor", DOCTOR, 8),
    Command("traces", TRACES_ARGV, 30),  # offline (see run): a fetch is refused in one line, never attempted
    Command("not-a-command", NOT_A_COMMAND.map(lambda a: a), 40),
    Command("train_tiny", _train_tiny_argv(), 6, main=train_tiny.main),
]


def run(argv: list[str], main=labsupport_main) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    offline = os.environ.get("LABSUPPORT_OFFLINE")
    os.environ["LABSUPPORT_OFFLINE"] = "1"  # a machine without ../shared/traces must not try to download
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a library warning is not the command's output
            rc = main(argv)
    finally:
        if offline is None:
            del os.environ["LABSUPPORT_OFFLINE"]
        else:
            os.environ["LABSUPPORT_OFFLINE"] = offline
    return rc, out.getvalue(), err.getvalue()


def _refuse_constant(constant):
    raise AssertionError(f"not strict JSON: {constant}")


def check_the_rule(argv: list[str], main=labsupport_main) -> None:
    rc, out, err = run(argv, main)
    shown = f"argv={[a[:60] for a in argv]!r} rc={rc}\nstdout={out[:500]!r}\nstderr={err[:1500]!r}"
    assert rc in (0, 2), shown
    assert "Traceback" not in err + out and "internal error" not in err, shown
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and not out, shown
        assert len(err) < 4500, shown  # a huge value is cut, not echoed
    elif "--json" in argv and "--help" not in argv and "-h" not in argv:
        json.loads(out, parse_constant=_refuse_constant)


@pytest.mark.slow  # hypothesis drives every command many times
@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_any_input_exits_0_or_2_with_one_line_and_strict_json(command):
    @settings(max_examples=command.examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(argv=command.argv)
    def check(argv):
        check_the_rule(argv, command.main)

    check()


def test_the_strategies_reach_both_outcomes():
    """The sweep is not vacuous: for each command, examples like those drawn run (0) and are refused (2)."""
    samples = {"ledger": (["ledger", "--json", "--s-max", "1000000"], ["ledger", "--s-max", "nan"]),
               "simulate": (["simulate", "--trace", "synthetic", "--synthetic-requests", "3", "--json"],
                            ["simulate", "--watermark", "1"]),
               "bench": (["bench", "engine", "--limit", "5", "--profile-requests", "0"], ["bench", "viz", "--repeats", "x"]),
               "doctor": (["doctor", "--json"], ["doctor", "--bogus"]),
               "traces": (["traces", "--list"], ["traces", "azure"]),
               "not-a-command": (["--help"], ["nope"]),
               "train_tiny": (["--steps", "1", "--seq-len", "8", "--corpus", str(Path(_TMP) / "corpus.txt"), "--out",
                               str(Path(_TMP) / "tiny.pt")], ["--lr", "nan"])}
    mains = {c.name: c.main for c in COMMANDS}
    assert set(samples) == set(mains)
    for name, (ok, bad) in samples.items():
        assert run(ok, mains[name])[0] == 0 and run(bad, mains[name])[0] == 2, name
        check_the_rule(ok, mains[name])
        check_the_rule(bad, mains[name])


def teardown_module():
    shutil.rmtree(_TMP, ignore_errors=True)
