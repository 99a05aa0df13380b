"""Workloads for the labs: the lecture's synthetic ones and real public serving traces (§10.2–§10.5).

Synthetic:
  `chat_workload`      the fixed 512-token prompt / 128-token output chat workload of §10.2;
  `lognormal_workload` sequence lengths with median 800 and 5% above 20,000 tokens (Exercise 3);
  `agent_session`      Lecture 5's 20-step agent: 97,000 submitted prompt tokens, 7,700 distinct (Exercise 5);
  `fanout_request`     n completions off one prompt (§10.4).

Real traces (`load_trace`):
  azure-conv, azure-code  Azure LLM Inference Trace 2023 (CSV: TIMESTAMP, ContextTokens, GeneratedTokens).
      CC BY 4.0; cite Patel et al., "Splitwise: Efficient generative LLM inference using phase
      splitting", ISCA 2024.
  mooncake-conversation, mooncake-synthetic  Mooncake FAST'25 traces (JSONL: timestamp in ms,
      input_length, output_length, hash_ids with one id per 512-token prompt block).  Apache-2.0
      repository; cite Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST 2025.

A trace file is looked up in this order: an explicit path, $LABSUPPORT_DATA, the repository's
data/, then ../shared/traces/ beside the repository ($LABSUPPORT_HIDE_TRACES=1 hides them all, to
run as a fresh clone would).  If none holds it, `load_trace` says how to get the file and falls
back to a synthetic workload fitted to the trace's statistics, labelled as such
(`Workload.synthetic`); it does not reach the network by itself.  `python -m labsupport traces`
(or `download(name)`) fetches the public files into data/ (or $LABSUPPORT_DATA), sha256-verified
and resumable; LABSUPPORT_OFFLINE=1 refuses any download.
"""
from __future__ import annotations

import codecs
import csv
import json
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import NormalDist
from typing import Iterator, Sequence

import numpy as np

from labsupport.checks import MAX_TOKENS, as_flag, as_real, shown
from labsupport.checks import as_count as _count

__all__ = [
    "Request", "Workload", "TraceInfo", "TraceStats", "TRACES", "TraceFormatError", "TraceUnavailable",
    "TraceNotice", "chat_workload", "lognormal_params", "lognormal_workload", "agent_session",
    "fanout_request", "fanout_workload", "find_trace", "trace_search_dirs", "traces_hidden", "data_dir", "download",
    "load_trace",
    "load_azure", "load_mooncake", "read_azure_csv", "read_mooncake_jsonl", "synthetic_trace",
    "prefix_hit_rate", "mooncake_token_ids", "MOONCAKE_BLOCK_TOKENS", "REPO_ROOT",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep
MOONCAKE_BLOCK_TOKENS = 512
MAX_REQUESTS = 10**7  # a generated workload's size (a request costs about 200 B here and more in the engine)


class TraceFormatError(ValueError):
    """A trace file does not have the expected format; the message names file and line."""


class TraceUnavailable(FileNotFoundError):
    """The trace is in none of the searched places and could not be downloaded."""


class TraceNotice(UserWarning):
    """A trace was replaced by a synthetic stand-in, or rows were skipped."""


@dataclass(frozen=True)
class Request:
    """One serving request.  Lengths are in tokens; `arrival_s` counts from the workload's start."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # Mooncake: one id per 512-token prompt block
    session_id: int | None = None
    n: int = 1  # completions sharing this prompt (fan-out, §10.4)
    token_ids: tuple[int, ...] | None = None  # prompt token ids, when the workload defines them

    def __post_init__(self):
        _count("prompt_tokens", self.prompt_tokens, 0, MAX_TOKENS)
        _count("output_tokens", self.output_tokens, 0, MAX_TOKENS)
        _count("n", self.n, 1, MAX_REQUESTS)
        as_real("arrival_s", self.arrival_s, minimum=0)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass
class Workload:
    """A named list of requests and where they came from."""

    name: str
    requests: list[Request]
    source: str
    synthetic: bool
    citation: str = ""
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    def __getitem__(self, i):
        return self.requests[i]

    def head(self, n: int) -> "Workload":
        return Workload(self.name, self.requests[:n], self.source, self.synthetic, self.citation,
                        self.notes + [f"first {n} requests"])

    def prompt_lengths(self) -> np.ndarray:
        return np.array([r.prompt_tokens for r in self.requests], dtype=np.int64)

    def output_lengths(self) -> np.ndarray:
        return np.array([r.output_tokens for r in self.requests], dtype=np.int64)

    def total_lengths(self) -> np.ndarray:
        return self.prompt_lengths() + self.output_lengths()

    def as_pairs(self) -> list[tuple[int, int]]:
        """(prompt_tokens, output_tokens) per request, what the allocator simulations take."""
        return [(r.prompt_tokens, r.output_tokens) for r in self.requests]

    def summary(self) -> dict[str, float]:
        if not self.requests:
            return {"count": 0}
        p, o, t = self.prompt_lengths(), self.output_lengths(), self.total_lengths()
        arr = [r.arrival_s for r in self.requests]
        return {
            "count": len(self.requests),
            "duration_s": max(arr) - min(arr),
            "prompt_median": float(np.median(p)), "prompt_p99": float(np.percentile(p, 99)),
            "prompt_mean": float(p.mean()), "prompt_max": int(p.max()),
            "output_median": float(np.median(o)), "output_p99": float(np.percentile(o, 99)),
            "output_mean": float(o.mean()), "output_max": int(o.max()),
            "total_over_4096": float((t > 4096).mean()), "total_over_32768": float((t > 32768).mean()),
        }

    def describe(self) -> str:
        s = self.summary()
        label = "SYNTHETIC" if self.synthetic else "real"
        if not s["count"]:
            return f"{self.name} ({label}): empty"
        return (f"{self.name} ({label}, {self.source}): {s['count']:,} requests over {s['duration_s']:,.0f} s; "
                f"prompt median {s['prompt_median']:,.0f} / p99 {s['prompt_p99']:,.0f} tokens, "
                f"output median {s['output_median']:,.0f} / p99 {s['output_p99']:,.0f}")


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(_count("seed", seed, 0))


def _arrivals(num: int, rate_per_s: float | None, rng: np.random.Generator) -> np.ndarray:
    if rate_per_s is None:
        return np.zeros(num)
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, (int, float)) or not 0 < rate_per_s < math.inf \
            or not math.isfinite(1.0 / rate_per_s):
        raise ValueError(f"rate_per_s must be positive and finite (and its mean gap 1/rate too), got {shown(rate_per_s)}")
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=num))  # Poisson arrivals


# ---------------------------------------------------------------------------------------------
# Synthetic generators
# ---------------------------------------------------------------------------------------------


def chat_workload(num_requests: int = 200, prompt_tokens: int = 512, output_tokens: int = 128,
                  rate_per_s: float | None = None, seed: int = 0) -> Workload:
    """§10.2's chat workload: every request a 512-token prompt and a 128-token answer (640 tokens)."""
    num = _count("num_requests", num_requests, 1, MAX_REQUESTS)
    p = _count("prompt_tokens", prompt_tokens, 1, MAX_TOKENS)
    o = _count("output_tokens", output_tokens, 1, MAX_TOKENS)
    arr = _arrivals(num, rate_per_s, _rng(seed))
    reqs = [Request(i, float(arr[i]), p, o) for i in range(num)]
    return Workload(f"chat {p}/{o}", reqs, "synthetic (lecture §10.2)", True)


def lognormal_params(median_tokens: float, tail_tokens: float, tail_fraction: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this median and P(length > tail_tokens) = tail_fraction.

    median = e^mu, so mu = ln(median); the tail condition gives sigma = ln(tail / median) / z,
    z the standard normal's (1 - tail_fraction) quantile (1.6449 for 5%).
    """
    if not median_tokens > 0:
        raise ValueError(f"median_tokens must be positive, got {median_tokens!r}")
    if not tail_tokens > median_tokens:
        raise ValueError(f"tail_tokens ({tail_tokens!r}) must exceed median_tokens ({median_tokens!r})")
    if not 0 < tail_fraction < 0.5:
        raise ValueError(f"tail_fraction must be in (0, 0.5), got {tail_fraction!r}")
    z = NormalDist().inv_cdf(1 - tail_fraction)
    return math.log(median_tokens), math.log(tail_tokens / median_tokens) / z


def lognormal_workload(num_requests: int = 1000, median_tokens: float = 800, tail_tokens: float = 20_000,
                       tail_fraction: float = 0.05, output_share: float = 0.2, max_tokens: int | None = None,
                       rate_per_s: float | None = None, seed: int = 0) -> Workload:
    """Exercise 3: total sequence lengths lognormal with median 800 and 5% above 20,000 tokens.

    Each length L is split into output = max(1, round(L * output_share)) and prompt = L - output
    (the default share 0.2 is the chat workload's 128/640), so totals follow the distribution
    exactly.  `max_tokens` clips the tail (a context window), None keeps it.
    """
    num = _count("num_requests", num_requests, 1, MAX_REQUESTS)
    if not 0 < output_share < 1:
        raise ValueError(f"output_share must be in (0, 1), got {output_share!r}")
    mu, sigma = lognormal_params(median_tokens, tail_tokens, tail_fraction)
    rng = _rng(seed)
    lengths = np.maximum(2, np.rint(rng.lognormal(mu, sigma, size=num))).astype(np.int64)
    if max_tokens is not None:
        lengths = np.minimum(lengths, _count("max_tokens", max_tokens, 2))
    arr = _arrivals(num, rate_per_s, rng)
    reqs = []
    for i, n in enumerate(lengths.tolist()):
        out = min(n - 1, max(1, round(n * output_share)))
        reqs.append(Request(i, float(arr[i]), n - out, out))
    return Workload(f"lognormal median {median_tokens:g}, {100 * tail_fraction:g}% > {tail_tokens:,g}", reqs,
                    f"synthetic (Exercise 3; mu={mu:.4f}, sigma={sigma:.4f})", True)


def agent_session(steps: int = 20, submitted_tokens: int = 97_000, distinct_tokens: int = 7_700,
                  output_per_step: int = 80, step_interval_s: float = 1.0, session_id: int = 0) -> Workload:
    """Exercise 5: one agent session whose every step re-sends its whole context.

    Step i's prompt is the first p_i tokens of one growing token stream, p_i = a + i*d, with the
    last prompt holding all `distinct_tokens` and the prompts summing to `submitted_tokens`:
        a + (steps-1) d = distinct,   steps*a + steps(steps-1)/2 * d = submitted.
    The lecture's 97,000 / 7,700 over 20 steps gives a = 2,000 and d = 300 exactly: each step adds
    its 80 output tokens plus 220 tokens of tool results, and 92.06% of submitted tokens are re-sent.
    Token ids are defined (stream position + session offset) so a prefix cache can share them.
    The last step also decodes its 80 output tokens, so the session's peak KV is distinct + 80.
    """
    steps = _count("steps", steps, 1)
    submitted = _count("submitted_tokens", submitted_tokens, 1)
    distinct = _count("distinct_tokens", distinct_tokens, 1)
    out = _count("output_per_step", output_per_step, 1)
    if steps == 1:
        if submitted != distinct:
            raise ValueError(f"one step submits its context once: submitted_tokens ({submitted}) must equal "
                             f"distinct_tokens ({distinct})")
        first, growth = float(distinct), 0.0
    else:
        growth = (steps * distinct - submitted) / (steps * (steps - 1) / 2)
        first = distinct - (steps - 1) * growth
    if first < 1 or growth < 0:
        raise ValueError(f"no growing context fits: {steps} steps, {submitted} submitted, {distinct} distinct "
                         f"tokens give a first prompt of {first:.1f} and growth {growth:.1f} per step")
    if steps > 1 and growth < out:
        raise ValueError(f"each step's {out} output tokens must fit in the context growth of {growth:.1f} tokens")
    base = session_id * 10_000_000
    prompts = [round(first + i * growth) for i in range(steps)]
    reqs = [Request(i, i * step_interval_s, p, out, session_id=session_id, token_ids=tuple(range(base, base + p)))
            for i, p in enumerate(prompts)]
    return Workload(f"agent session ({steps} steps)", reqs,
                    f"synthetic (Exercise 5; first prompt {first:g}, +{growth:g} tokens per step)", True,
                    notes=[f"submitted {sum(prompts):,} prompt tokens, {prompts[-1]:,} distinct"])


def fanout_request(n: int = 8, prompt_tokens: int = 4096, output_tokens: int = 256, request_id: int = 0,
                   arrival_s: float = 0.0) -> Request:
    """One request asking for n completions of one prompt (§10.4: n=8 off 4K, 256 tokens each)."""
    return Request(request_id, arrival_s, _count("prompt_tokens", prompt_tokens, 1),
                   _count("output_tokens", output_tokens, 1), n=_count("n", n, 1))


def fanout_workload(num_requests: int = 10, n: int = 8, prompt_tokens: int = 4096, output_tokens: int = 256,
                    rate_per_s: float | None = None, seed: int = 0) -> Workload:
    num = _count("num_requests", num_requests, 1, MAX_REQUESTS)
    arr = _arrivals(num, rate_per_s, _rng(seed))
    reqs = [fanout_request(n, prompt_tokens, output_tokens, i, float(arr[i])) for i in range(num)]
    return Workload(f"fan-out n={n} off {prompt_tokens}", reqs, "synthetic (lecture §10.4)", True)


# ---------------------------------------------------------------------------------------------
# Real traces: registry, lookup, download
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceStats:
    """Length statistics of a trace, used to fit the synthetic stand-in (computed from the public
    file with numpy's default percentile; tests recompute them from the file)."""

    count: int
    duration_s: float
    prompt_median: float
    prompt_p99: float
    prompt_max: int
    output_median: float
    output_p99: float
    output_max: int


@dataclass(frozen=True)
class TraceInfo:
    name: str
    filename: str  # our name for the file (as in ../shared/traces/)
    upstream_name: str  # the file's name upstream (also accepted when looking a trace up)
    url: str
    sha256: str
    size_bytes: int
    format: str  # "azure-csv" or "mooncake-jsonl"
    citation: str
    license: str
    stats: TraceStats


_AZURE = ("Patel et al., \"Splitwise: Efficient generative LLM inference using phase splitting\", ISCA 2024; "
          "Azure LLM Inference Trace 2023, github.com/Azure/AzurePublicDataset")
_MOONCAKE = ("Qin et al., \"Mooncake: Trading More Storage for Less Computation\", FAST 2025; "
             "github.com/kvcache-ai/Mooncake, FAST25-release/traces")
_AZURE_RAW = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_MOONCAKE_RAW = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/"

TRACES: dict[str, TraceInfo] = {t.name: t for t in (
    TraceInfo("azure-conv", "AzureLLMInferenceTrace_2023_conv.csv", "AzureLLMInferenceTrace_conv.csv",
              _AZURE_RAW + "AzureLLMInferenceTrace_conv.csv",
              "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719_188, "azure-csv",
              _AZURE, "CC BY 4.0", TraceStats(19_366, 3501.72, 1020, 4142, 14_050, 129, 601, 1000)),
    TraceInfo("azure-code", "AzureLLMInferenceTrace_2023_code.csv", "AzureLLMInferenceTrace_code.csv",
              _AZURE_RAW + "AzureLLMInferenceTrace_code.csv",
              "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 320_117, "azure-csv",
              _AZURE, "CC BY 4.0", TraceStats(8_819, 3435.95, 1469, 7436, 7437, 13, 251.46, 1899)),
    TraceInfo("mooncake-conversation", "mooncake_fast25_conversation_trace.jsonl", "conversation_trace.jsonl",
              _MOONCAKE_RAW + "conversation_trace.jsonl",
              "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533, "mooncake-jsonl",
              _MOONCAKE, "Apache-2.0 (repository)", TraceStats(12_031, 3536.999, 6909, 85_400.4, 126_195, 350, 1118.5, 2000)),
    TraceInfo("mooncake-synthetic", "mooncake_fast25_synthetic_trace.jsonl", "synthetic_trace.jsonl",
              _MOONCAKE_RAW + "synthetic_trace.jsonl",
              "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 1_136_313, "mooncake-jsonl",
              _MOONCAKE, "Apache-2.0 (repository)", TraceStats(3_993, 1022.025, 11_587, 66_456.16, 191_378, 69, 768.08, 893)),
)}


def _info(name: str) -> TraceInfo:
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; choose one of: {', '.join(TRACES)}")
    return TRACES[name]


HIDE_TRACES_ENV = "LABSUPPORT_HIDE_TRACES"


def traces_hidden() -> bool:
    """True when $LABSUPPORT_HIDE_TRACES is set: the lookup then finds no trace (an explicit path still
    works), so a machine that has them runs the labs as a fresh clone without them would."""
    return bool(os.environ.get(HIDE_TRACES_ENV))


def trace_search_dirs() -> list[tuple[str, Path]]:
    """Where traces are looked for, in order (after an explicit path); `find_trace` skips them all
    while `traces_hidden()`."""
    dirs = []
    env = os.environ.get("LABSUPPORT_DATA")
    if env:
        dirs.append(("$LABSUPPORT_DATA", Path(env).expanduser()))
    dirs.append(("data/", REPO_ROOT / "data"))
    dirs.append(("../shared/traces/", REPO_ROOT.parent / "shared" / "traces"))
    return dirs


def find_trace(name: str, path: str | os.PathLike | None = None) -> Path | None:
    """The trace's file: `path` if given (it must exist), else the first hit in `trace_search_dirs()`."""
    info = _info(name)
    if path is not None:
        p = Path(path).expanduser()
        if p.is_dir():
            for fname in (info.filename, info.upstream_name):
                if (p / fname).is_file():
                    return p / fname
            raise FileNotFoundError(f"{p} holds neither {info.filename} nor {info.upstream_name}")
        if not p.exists():
            raise FileNotFoundError(f"trace file {p} does not exist")
        if not p.is_file():  # a FIFO or a device would block or never end
            raise FileNotFoundError(f"trace file {p} is not a regular file")
        return p
    if traces_hidden():
        return None
    for _, d in trace_search_dirs():
        for fname in (info.filename, info.upstream_name):
            if (d / fname).is_file():
                return d / fname
    return None


FETCH_COMMAND = "python -m labsupport traces"


def _how_to_get(info: TraceInfo) -> str:
    return (f"run `{FETCH_COMMAND} {info.name}` (in a terminal, or after a ! in a cell) to fetch it, "
            f"sha256-verified, into {data_dir()}, or point $LABSUPPORT_DATA at a folder holding {info.filename}")


def data_dir() -> Path:
    """Where `download` (and `python -m labsupport traces`) puts a trace: $LABSUPPORT_DATA, else data/."""
    env = os.environ.get("LABSUPPORT_DATA")
    return Path(env).expanduser() if env else REPO_ROOT / "data"


def download(name: str, dest_dir: str | os.PathLike | None = None, timeout: float = 30.0,
             progress: bool | None = None) -> Path:
    """Fetch a public trace from its published address into `dest_dir` (default `data_dir()`).

    Resumable and verified (`labsupport.fetch`): the file appears under its name only once its
    sha256 matches `TRACES[name].sha256`.  Refused while $LABSUPPORT_OFFLINE is set.
    """
    from labsupport.fetch import FetchError, fetch

    info = _info(name)
    dest = Path(dest_dir).expanduser() if dest_dir is not None else data_dir()
    if os.environ.get("LABSUPPORT_OFFLINE"):
        raise TraceUnavailable(f"LABSUPPORT_OFFLINE is set, so the {name} trace is not downloaded "
                               f"(unset it to fetch {info.url})")
    try:
        return fetch(info.url, dest / info.filename, info.sha256, info.size_bytes, timeout=timeout,
                     progress=progress, label=name)
    except FetchError as e:
        raise TraceUnavailable(str(e)) from None


# ---------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------


_ASCII_INT = re.compile(r"-?[0-9]{1,30}")  # str.isdigit() and int() would take '١٢' and '²'
_FRACTION = re.compile(r"[0-9]+")
_WHOLE = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})\s+([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})")
MAX_TIMESTAMP_MS = 2**53  # a Mooncake timestamp (ms) is exact in a float up to here: 285,000 years
MAX_LINE_CHARS = 1 << 20  # a JSONL line longer than this is refused, not read into memory whole


def _parse_time(text: str) -> float:
    """Seconds since the epoch of 'YYYY-MM-DD HH:MM:SS[.fraction]' (any number of fraction digits)."""
    text = text.strip()
    if not text.isascii():  # strptime's %Y would take other scripts' digits
        raise ValueError(f"TIMESTAMP {shown(text)} has non-ASCII characters")
    whole, _, frac = text.partition(".")
    # strptime's own pattern, "%Y-%m-%d %H:%M:%S", matched directly: strptime took half of reading a trace
    fields = _WHOLE.fullmatch(whole)
    if fields is None:
        raise ValueError(f"time data {whole!r} does not match format '%Y-%m-%d %H:%M:%S'")
    t = datetime(*map(int, fields.groups()))  # and it refuses a day or an hour out of range as strptime does
    if frac and not _FRACTION.fullmatch(frac):
        raise ValueError(f"bad fractional seconds {shown(frac)}")
    return (t - datetime(1970, 1, 1)).total_seconds() + (float("0." + frac) if frac else 0.0)


def _int_field(value, what: str, minimum: int) -> int:
    """A token count: a CSV field of ASCII digits or a JSON integer, in [minimum, MAX_TOKENS]."""
    if isinstance(value, str):
        text = value.strip()
        if not _ASCII_INT.fullmatch(text):
            raise ValueError(f"{what} is not an integer: {shown(text)}")
        value = int(text)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is not an integer: {shown(value)}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    if value > MAX_TOKENS:
        raise ValueError(f"{what} is {shown(value)} tokens, beyond the {MAX_TOKENS:,} any sequence here can hold")
    return value


def _json_int_field(value, what: str, minimum: int) -> int:
    """A length in a JSON record: a JSON number, not a string of digits."""
    if isinstance(value, str):
        raise ValueError(f"{what} is not an integer: {shown(value)} is a JSON string (write the number unquoted)")
    return _int_field(value, what, minimum)


_UNDECODED = re.compile("[\udc80-\udcff]")  # where surrogateescape put a byte that is not UTF-8


def _not_utf8(fields) -> str | None:
    """Why a decoded row is not UTF-8 text (its undecodable bytes became lone surrogates), or None."""
    for text in fields:
        m = None if text.isascii() else _UNDECODED.search(text)
        if m:
            return f"not UTF-8 text (byte 0x{ord(m.group()) - 0xdc00:02x} at character {m.start() + 1} of a field)"
    return None


def _open_text(path: Path, **kwargs):
    """Open a trace as UTF-8 (a BOM is skipped; undecodable bytes are kept for the row check to name)."""
    with open(path, "rb") as f:
        head = f.read(4)
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                      (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if head.startswith(bom):
            raise TraceFormatError(f"{path}:1: the file is {name} text; save it as UTF-8")
    return open(path, encoding="utf-8-sig", errors="surrogateescape", **kwargs)


class _Rows:
    """Collects malformed rows: raise on the first, or skip and report them all at the end."""

    def __init__(self, path: Path, skip_malformed: bool):
        self.path, self.skip, self.bad = path, as_flag("skip_malformed", skip_malformed), []

    def error(self, line: int, why: str) -> None:
        msg = f"{self.path}:{line}: {why}"
        if not self.skip:
            raise TraceFormatError(msg)
        self.bad.append(msg)

    def notes(self) -> list[str]:
        if not self.bad:
            return []
        shown_ = "; ".join(self.bad[:5]) + (f"; ... ({len(self.bad) - 5} more)" if len(self.bad) > 5 else "")
        warnings.warn(f"skipped {len(self.bad)} malformed row(s): {shown_}", TraceNotice, stacklevel=3)
        return [f"skipped {len(self.bad)} malformed row(s)"] + self.bad


def _limit(limit) -> int | None:
    return None if limit is None else _count("limit", limit, 1)


def _csv_rows(reader, rows: _Rows):
    """(line, row) for each CSV record; a record the csv module cannot parse is a malformed row."""
    while True:
        before = reader.line_num
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            rows.error(reader.line_num, f"not a CSV row ({e})")
            if reader.line_num == before:  # nothing consumed: the reader cannot move past it
                return
            continue
        yield reader.line_num, row


def _azure_header(reader, rows: _Rows, path: Path) -> tuple[int, list[int]]:
    """The header's width and the positions of TIMESTAMP, ContextTokens, GeneratedTokens."""
    need = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    try:
        header = next(reader, None)
    except csv.Error as e:
        raise TraceFormatError(f"{path}:1: the header is not a CSV row ({e})") from None
    if header is None:
        raise TraceFormatError(f"{path}:1: empty file, expected a header {','.join(need)}")
    why = _not_utf8(header)
    if why:
        raise TraceFormatError(f"{path}:1: the header is {why}")
    header = [h.strip() for h in header]
    missing = [c for c in need if c not in header]
    if missing:
        raise TraceFormatError(f"{path}:1: header {shown(header, 120)} lacks column(s) {missing}")
    for c in need:
        if header.count(c) > 1:
            cols = [i + 1 for i, h in enumerate(header) if h == c]
            raise TraceFormatError(f"{path}:1: header names {c} more than once (columns {cols}): which one is meant?")
    return len(header), [header.index(c) for c in need]


def read_azure_csv(path: str | os.PathLike, limit: int | None = None, skip_malformed: bool = False,
                   name: str | None = None) -> Workload:
    """Parse an Azure LLM Inference 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    path = Path(path)
    limit = _limit(limit)
    rows = _Rows(path, skip_malformed)
    reqs: list[Request] = []
    t0 = None
    with _open_text(path, newline="") as f:
        reader = csv.reader(f, strict=True)
        width, cols = _azure_header(reader, rows, path)
        for line, row in _csv_rows(reader, rows):
            if limit is not None and len(reqs) >= limit:
                break
            if not row or all(not c.strip() for c in row):
                continue
            why = _not_utf8(row)
            if why:
                rows.error(line, why)
                continue
            if len(row) != width:
                rows.error(line, f"expected {width} fields, got {len(row)}: {shown(row, 120)}")
                continue
            try:
                ts = _parse_time(row[cols[0]])
                prompt = _int_field(row[cols[1]], "ContextTokens", 1)
                output = _int_field(row[cols[2]], "GeneratedTokens", 1)
            except ValueError as e:
                rows.error(line, f"{e}: {shown(row, 120)}")
                continue
            t0 = ts if t0 is None else t0
            if ts < t0:  # arrivals count from the first row, so none may come before it
                rows.error(line, f"TIMESTAMP {row[cols[0]].strip()!r} is earlier than the first row's: {shown(row, 120)}")
                continue
            reqs.append(Request(len(reqs), ts - t0, prompt, output))
    notes = rows.notes()
    return Workload(name or path.stem, reqs, f"file {path}", False, _AZURE, notes)


def _json_lines(f):
    """(line number, text or None) for each line; None for a line longer than MAX_LINE_CHARS (skipped unread)."""
    line = 0
    while True:
        text = f.readline(MAX_LINE_CHARS + 1)
        if not text:
            return
        line += 1
        if len(text) > MAX_LINE_CHARS and not text.endswith("\n"):
            while (rest := f.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass
            yield line, None
        else:
            yield line, text


def _unique_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"field {shown(dup)} appears more than once in one object: which one is meant?")
    return dict(pairs)


def _json_record(text: str) -> dict:
    """One JSONL line as a dict; ValueError says why it is not one."""
    why = _not_utf8([text])
    if why:
        raise ValueError(f"the line is {why}")
    try:
        rec = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError("not a trace record: JSON nested too deeply to read") from None
    except ValueError as e:  # a duplicated key, or an integer of more than 4,300 digits
        raise ValueError(f"not a trace record: {e}") from None
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    return rec


def _mooncake_request(rec: dict, index: int) -> Request:
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in rec]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    ts = rec["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < math.inf:
        raise ValueError(f"timestamp must be a finite, non-negative number of ms, got {shown(ts)}")
    if ts > MAX_TIMESTAMP_MS:
        raise ValueError(f"timestamp {shown(ts)} ms is beyond {MAX_TIMESTAMP_MS:,} ms (285,000 years)")
    prompt = _json_int_field(rec["input_length"], "input_length", 1)
    output = _json_int_field(rec["output_length"], "output_length", 1)
    ids = rec["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise ValueError(f"hash_ids must be a list of integers, got {shown(ids)}")
    want = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if len(ids) != want:
        raise ValueError(f"hash_ids has {len(ids)} ids, expected ceil({prompt}/512) = {want}")
    return Request(index, ts / 1000.0, prompt, output, tuple(ids))


def read_mooncake_jsonl(path: str | os.PathLike, limit: int | None = None, skip_malformed: bool = False,
                        name: str | None = None) -> Workload:
    """Parse a Mooncake FAST'25 JSONL trace; checks len(hash_ids) == ceil(input_length / 512)."""
    path = Path(path)
    limit = _limit(limit)
    rows = _Rows(path, skip_malformed)
    reqs: list[Request] = []
    with _open_text(path) as f:
        for line, text in _json_lines(f):
            if limit is not None and len(reqs) >= limit:
                break
            if text is None:
                rows.error(line, f"line longer than {MAX_LINE_CHARS:,} characters: not a trace record")
                continue
            if not text.strip():
                continue
            try:
                reqs.append(_mooncake_request(_json_record(text), len(reqs)))
            except ValueError as e:
                rows.error(line, str(e))
    notes = rows.notes()
    return Workload(name or path.stem, reqs, f"file {path}", False, _MOONCAKE, notes)


def synthetic_trace(name: str, num_requests: int | None = None, seed: int = 0) -> Workload:
    """A stand-in for a trace that is not available, fitted to its statistics (`TraceInfo.stats`).

    Prompt and output lengths are lognormal with the trace's median and 99th percentile, clipped
    to [1, the trace's maximum]; arrivals are Poisson at the trace's mean rate.  Mooncake stand-ins
    get unique hash ids: their prefix sharing is not modelled.  It is labelled synthetic everywhere.
    """
    info = _info(name)
    st = info.stats
    num = st.count if num_requests is None else _count("num_requests", num_requests, 1, MAX_REQUESTS)
    rng = _rng(seed)
    z99 = NormalDist().inv_cdf(0.99)

    def draw(median, p99, top):
        sigma = math.log(p99 / median) / z99
        return np.clip(np.rint(rng.lognormal(math.log(median), sigma, size=num)), 1, top).astype(np.int64)

    prompts, outputs = draw(st.prompt_median, st.prompt_p99, st.prompt_max), draw(st.output_median, st.output_p99, st.output_max)
    arr = _arrivals(num, st.count / st.duration_s, rng)
    reqs = []
    next_id = 0
    for i in range(num):
        p = int(prompts[i])
        ids = ()
        if info.format == "mooncake-jsonl":
            k = -(-p // MOONCAKE_BLOCK_TOKENS)
            ids, next_id = tuple(range(next_id, next_id + k)), next_id + k
        reqs.append(Request(i, float(arr[i]), p, int(outputs[i]), ids))
    return Workload(f"SYNTHETIC stand-in for {name}", reqs,
                    f"synthetic, fitted to {name}'s median/p99 lengths and mean rate (real file unavailable)",
                    True, info.citation, [_how_to_get(info)])


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (a lab), where a warning is drawn as a pink stderr box."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def _notice(message: str, brief: str = "") -> None:
    """Warn `TraceNotice` at the first caller outside labsupport (scripts, tests).  In a lab, print `brief`
    instead: one line in the labs' own style, without this machine's paths (a projected notebook shows it)."""
    if brief and _in_kernel():
        print(f"Note: {brief}")
        return
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, TraceNotice, stacklevel=level)


def load_trace(name: str, path: str | os.PathLike | None = None, *, limit: int | None = None,
               download_missing: bool = False, fallback: bool = True, skip_malformed: bool = False) -> Workload:
    """Load a real trace by name (see the module docstring for the lookup order and fallback).

    A missing trace is fetched only when asked (`download_missing=True`): a notebook never reaches
    the network on its own; the notice names the command that does.
    """
    info = _info(name)
    p = find_trace(name, path)
    where = ", ".join(str(d) for _, d in trace_search_dirs())
    why = (f"hidden (${HIDE_TRACES_ENV} is set)" if traces_hidden() and path is None else f"not found in {where}")
    if p is None and download_missing and not os.environ.get("LABSUPPORT_OFFLINE"):
        try:
            p = download(name)
        except TraceUnavailable as e:
            if not fallback:
                raise
            why += f"; the download failed: {e}"
    if p is None:
        if not fallback:
            raise TraceUnavailable(f"trace {name} is {why}; {_how_to_get(info)}")
        short = "hidden" if traces_hidden() and path is None else "not on this machine"
        _notice(f"trace {name} is {why}, so this is a SYNTHETIC stand-in fitted to its statistics; "
                f"{_how_to_get(info)}",
                f"trace {name} is {short}: these numbers come from a SYNTHETIC stand-in fitted to its statistics "
                f"(`{FETCH_COMMAND} {name}` fetches the real one).")
        return synthetic_trace(name, limit)
    reader = read_azure_csv if info.format == "azure-csv" else read_mooncake_jsonl
    return reader(p, limit=limit, skip_malformed=skip_malformed, name=name)


def load_azure(kind: str = "conv", path=None, **kwargs) -> Workload:
    """The Azure LLM Inference Trace 2023, kind 'conv' or 'code'."""
    if kind not in ("conv", "code"):
        raise ValueError(f"Azure trace kind must be 'conv' or 'code', got {kind!r}")
    return load_trace(f"azure-{kind}", path, **kwargs)


def load_mooncake(kind: str = "conversation", path=None, **kwargs) -> Workload:
    """A Mooncake FAST'25 trace, kind 'conversation' (real traffic) or 'synthetic'."""
    if kind not in ("conversation", "synthetic"):
        raise ValueError(f"Mooncake trace kind must be 'conversation' or 'synthetic', got {kind!r}")
    return load_trace(f"mooncake-{kind}", path, **kwargs)


# ---------------------------------------------------------------------------------------------
# Prefix structure
# ---------------------------------------------------------------------------------------------


def prefix_hit_rate(workload: Workload | Sequence[Request]) -> float:
    """Share of requested prompt blocks that an unbounded prefix cache would already hold.

    Requests are taken in order; block j of a request hits when the same chain of ids, blocks
    0..j, was requested before (a prefix cache shares leading blocks only, and a block's KV
    depends on everything before it).  Mooncake's hash ids already name whole prefixes; keying on
    the chain keeps the count right for id lists that do not.
    """
    chains: dict[tuple[int, int], int] = {}  # (id of the chain before, this block's id) -> chain id
    hits = total = 0
    for r in workload:
        chain = -1  # once a block misses, its new chain id makes every later block miss too
        for h in r.hash_ids:
            total += 1
            key = (chain, h)
            hits += key in chains
            chain = chains.setdefault(key, len(chains))
    if total == 0:
        raise ValueError("the workload has no hash ids (only Mooncake traces carry them)")
    return hits / total


def mooncake_token_ids(request: Request, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[int]:
    """Stand-in token ids for a Mooncake request: block j's tokens are derived from hash id j, so
    requests with equal leading hash ids get equal leading token ids (what a prefix cache needs)."""
    if not request.hash_ids:
        raise ValueError(f"request {request.request_id} has no hash ids")
    ids: list[int] = []
    for h in request.hash_ids:
        ids.extend(range(h * block_tokens, (h + 1) * block_tokens))
    return ids[: request.prompt_tokens]
