"""Workload generators against the lecture's figures, and the trace loaders against the real files.

Published figures come from ../shared/traces/SOURCES.md (request counts, medians, p99s, the
Mooncake prefix-hit shares); the lecture's come from §10.2–§10.4 and Exercises 3 and 5.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest

from labsupport import workloads as W
from real_traces import real_trace

REAL = {name: real_trace(name) for name in W.TRACES}  # $LABSUPPORT_DATA, data/ or ../shared/traces/, as the labs find them
needs_traces = pytest.mark.skipif(not all(REAL.values()),
                                  reason="the real traces are absent or hidden ($LABSUPPORT_HIDE_TRACES)")


# ---------------------------------------------------------------------------------------------
# Synthetic generators
# ---------------------------------------------------------------------------------------------


def test_chat_workload_is_512_plus_128():
    w = W.chat_workload(50)
    assert len(w) == 50 and w.synthetic
    assert set(w.total_lengths().tolist()) == {640}
    assert set(w.prompt_lengths().tolist()) == {512}


def test_lognormal_parameters_by_hand():
    mu, sigma = W.lognormal_params(800, 20_000, 0.05)
    assert mu == pytest.approx(math.log(800))
    # ln(20000/800) = ln 25 = 3.21888; z(0.95) = 1.644854
    assert sigma == pytest.approx(3.218876 / 1.644854, rel=1e-6)
    w = W.lognormal_workload(40_000, seed=1)
    t = w.total_lengths()
    assert np.median(t) == pytest.approx(800, rel=0.03)
    assert (t > 20_000).mean() == pytest.approx(0.05, abs=0.004)
    o = w.output_lengths()
    assert (o >= 1).all() and (w.prompt_lengths() >= 1).all()
    # each total L splits into output = max(1, round(0.2 L)) (the chat workload's 128 / 640) + prompt
    assert [int(x) for x in o[:2000]] == [max(1, round(0.2 * int(n))) for n in t[:2000]]
    with pytest.raises(ValueError, match="tail_tokens"):
        W.lognormal_params(800, 500, 0.05)


def test_agent_session_matches_exercise_5():
    w = W.agent_session()
    prompts = w.prompt_lengths()
    assert len(w) == 20
    assert prompts.sum() == 97_000 and prompts[-1] == 7_700
    assert prompts[0] == 2_000 and set(np.diff(prompts).tolist()) == {300}
    assert 1 - 7_700 / prompts.sum() == pytest.approx(0.9206, abs=1e-4)  # "92% re-sent"
    # each prompt is the previous one extended: a prefix cache sees the whole history again
    for a, b in zip(w.requests, w.requests[1:]):
        assert b.token_ids[: a.prompt_tokens] == a.token_ids
    with pytest.raises(ValueError, match="output tokens must fit"):
        W.agent_session(steps=20, submitted_tokens=97_000, distinct_tokens=7_700, output_per_step=400)


def test_fanout_request_tokens():
    r = W.fanout_request(8, 4096, 256)
    unshared = r.n * (r.prompt_tokens + r.output_tokens)
    shared = r.prompt_tokens + r.n * r.output_tokens
    assert (unshared, shared) == (34_816, 6_144)  # §10.4: 5.7x
    assert len(W.fanout_workload(3, n=16, prompt_tokens=8192, output_tokens=512)) == 3
    with pytest.raises(ValueError, match="n must be >= 1"):
        W.fanout_request(0)


# ---------------------------------------------------------------------------------------------
# Real traces
# ---------------------------------------------------------------------------------------------


@needs_traces
@pytest.mark.parametrize("name", list(W.TRACES))
def test_checksums_and_sizes_match_the_shared_files(name):
    info = W.TRACES[name]
    data = REAL[name].read_bytes()
    assert len(data) == info.size_bytes
    assert hashlib.sha256(data).hexdigest() == info.sha256


@needs_traces
def test_azure_traces_match_published_shape():
    conv = W.load_azure("conv", download_missing=False, fallback=False)
    code = W.load_azure("code", download_missing=False, fallback=False)
    assert not conv.synthetic and str(REAL["azure-conv"]) in conv.source
    assert (len(conv), len(code)) == (19_366, 8_819)
    sc, sd = conv.summary(), code.summary()
    assert (sc["prompt_median"], sc["output_median"], sc["prompt_p99"]) == (1020, 129, 4142)
    assert (sd["prompt_median"], sd["output_median"]) == (1469, 13)
    assert conv.total_lengths().max() < 32_768  # "Nothing exceeds 32K tokens"
    assert conv[0].arrival_s == 0.0 and 3000 < sc["duration_s"] <= 3600  # one hour
    assert (conv[0].prompt_tokens, conv[0].output_tokens) == (374, 44)  # the file's first row


@needs_traces
def test_mooncake_traces_match_published_shape():
    conv = W.load_mooncake("conversation", download_missing=False, fallback=False)
    syn = W.load_mooncake("synthetic", download_missing=False, fallback=False)
    assert (len(conv), len(syn)) == (12_031, 3_993)
    s = conv.summary()
    assert (s["prompt_median"], s["output_median"]) == (6909, 350)
    assert s["prompt_p99"] == pytest.approx(85_400, abs=1)
    assert s["total_over_4096"] == pytest.approx(0.678, abs=5e-4)
    assert s["total_over_32768"] == pytest.approx(0.070, abs=5e-4)
    assert W.prefix_hit_rate(conv) == pytest.approx(0.366, abs=5e-4)
    assert W.prefix_hit_rate(syn) == pytest.approx(0.640, abs=5e-4)
    r = conv[0]
    ids = W.mooncake_token_ids(r)
    assert len(ids) == r.prompt_tokens and len(r.hash_ids) == math.ceil(r.prompt_tokens / 512)


def test_prefix_hit_rate_counts_only_leading_blocks():
    reqs = [W.Request(0, 0.0, 1536, 1, hash_ids=(1, 2, 3)),
            W.Request(1, 0.0, 1536, 1, hash_ids=(9, 2, 3)),  # 2 and 3 were seen, but after a miss: 0 hits
            W.Request(2, 0.0, 1536, 1, hash_ids=(1, 2, 4))]  # 1, 2 hit; 4 is new
    assert W.prefix_hit_rate(reqs) == 2 / 9
    # a block is shared only with the same prefix before it: (2, 3) starting a request is not the (2, 3)
    # that followed 1, and (1, 2) after (3,) is not the (1, 2) that began a request
    moved = [W.Request(0, 0.0, 1536, 1, hash_ids=(1, 2, 3)),
             W.Request(1, 0.0, 1024, 1, hash_ids=(2, 3)),
             W.Request(2, 0.0, 1536, 1, hash_ids=(3, 1, 2)),
             W.Request(3, 0.0, 1024, 1, hash_ids=(2, 3))]  # the (2, 3) prefix of request 1: 2 hits
    assert W.prefix_hit_rate(moved) == 2 / 10
    with pytest.raises(ValueError, match="no hash ids"):
        W.prefix_hit_rate([W.Request(0, 0.0, 10, 1)])


def test_mooncake_token_ids_share_exactly_the_shared_hash_blocks():
    a = W.Request(0, 0.0, 1100, 1, hash_ids=(7, 8, 9))  # 512 + 512 + 76 tokens
    b = W.Request(1, 0.0, 1500, 1, hash_ids=(7, 8, 4))
    ia, ib = W.mooncake_token_ids(a), W.mooncake_token_ids(b)
    assert (len(ia), len(ib)) == (1100, 1500)
    assert ia[:1024] == ib[:1024] and ia[:512] == list(range(7 * 512, 8 * 512))
    assert not set(ia[1024:]) & set(ib[1024:])  # block 2 differs: no token id in common
    with pytest.raises(ValueError, match="no hash ids"):
        W.mooncake_token_ids(W.Request(2, 0.0, 10, 1))


@needs_traces
def test_fallback_statistics_are_the_files_statistics():
    for name, info in W.TRACES.items():
        w = W.load_trace(name, download_missing=False, fallback=False)
        p, o = w.prompt_lengths(), w.output_lengths()
        st = info.stats
        assert st.count == len(w)
        assert (st.prompt_median, st.output_median) == (np.median(p), np.median(o))
        assert st.prompt_p99 == pytest.approx(np.percentile(p, 99), abs=0.01)
        assert st.output_p99 == pytest.approx(np.percentile(o, 99), abs=0.01)
        assert (st.prompt_max, st.output_max) == (p.max(), o.max())
        assert st.duration_s == pytest.approx(w.summary()["duration_s"], abs=0.01)


def test_lookup_order(tmp_path, monkeypatch):
    info = W.TRACES["azure-conv"]
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    shared = tmp_path / "shared" / "traces"
    shared.mkdir(parents=True)
    env = tmp_path / "env"
    env.mkdir()
    explicit = tmp_path / "mine.csv"
    for d in (repo / "data", shared, env):
        (d / info.filename).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    explicit.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    monkeypatch.setattr(W, "REPO_ROOT", repo)
    monkeypatch.setenv("LABSUPPORT_DATA", str(env))
    assert W.find_trace("azure-conv", explicit) == explicit
    assert W.find_trace("azure-conv") == env / info.filename
    monkeypatch.delenv("LABSUPPORT_DATA")
    assert W.find_trace("azure-conv") == repo / "data" / info.filename
    (repo / "data" / info.filename).unlink()
    assert W.find_trace("azure-conv") == shared / info.filename
    (shared / info.filename).rename(shared / info.upstream_name)  # the upstream name is accepted too
    assert W.find_trace("azure-conv") == shared / info.upstream_name
    (shared / info.upstream_name).unlink()
    assert W.find_trace("azure-conv") is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        W.find_trace("azure-conv", tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="unknown trace 'azure'"):
        W.find_trace("azure")


def test_default_search_reaches_shared_traces_from_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LABSUPPORT_DATA", raising=False)
    dirs = [d for _, d in W.trace_search_dirs()]
    assert dirs[-1] == Path(W.__file__).resolve().parent.parent.parent / "shared" / "traces"


def test_no_file_falls_back_to_a_labelled_synthetic_workload_without_touching_the_network(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.delenv("LABSUPPORT_DATA", raising=False)
    monkeypatch.delenv("LABSUPPORT_OFFLINE", raising=False)
    monkeypatch.delenv(W.HIDE_TRACES_ENV, raising=False)
    reached = []

    def offline(request, timeout):
        reached.append(request.full_url)
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.warns(W.TraceNotice, match="SYNTHETIC stand-in") as caught:
        w = W.load_trace("azure-conv", limit=4000)
    assert reached == []  # a lab never downloads by itself
    (notice,) = [str(c.message) for c in caught if c.category is W.TraceNotice]
    assert "run `python -m labsupport traces azure-conv`" in notice and str(tmp_path / "repo" / "data") in notice
    assert caught[0].filename == __file__  # shown under the line that loaded the trace, not inside labsupport
    assert w.synthetic and "SYNTHETIC" in w.name and "unavailable" in w.source
    assert any("python -m labsupport traces" in n for n in w.notes)
    s = w.summary()
    assert s["prompt_median"] == pytest.approx(1020, rel=0.1)
    assert s["output_median"] == pytest.approx(129, rel=0.1)
    with pytest.raises(W.TraceUnavailable, match="not found in"):
        W.load_trace("azure-conv", fallback=False)
    with pytest.raises(W.TraceUnavailable, match="could not reach https://raw.githubusercontent.com/Azure/"):
        W.load_trace("azure-conv", fallback=False, download_missing=True)  # asked: it tries, and says why not
    assert reached == [W.TRACES["azure-conv"].url]
    monkeypatch.setenv("LABSUPPORT_OFFLINE", "1")
    with pytest.raises(W.TraceUnavailable, match="not found"):
        W.load_trace("mooncake-conversation", fallback=False, download_missing=True)
    assert len(reached) == 1
    with pytest.warns(W.TraceNotice):
        m = W.load_trace("mooncake-conversation", limit=100)
    assert m.synthetic and all(len(r.hash_ids) == math.ceil(r.prompt_tokens / 512) for r in m)


def test_hidden_traces_are_not_found_but_an_explicit_path_still_is(tmp_path, monkeypatch):
    info = W.TRACES["azure-conv"]
    data = tmp_path / "data"
    data.mkdir()
    (data / info.filename).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n")
    monkeypatch.setenv("LABSUPPORT_DATA", str(data))
    monkeypatch.delenv(W.HIDE_TRACES_ENV, raising=False)
    assert W.find_trace("azure-conv") == data / info.filename
    monkeypatch.setenv(W.HIDE_TRACES_ENV, "1")
    assert W.traces_hidden() and W.find_trace("azure-conv") is None
    assert W.find_trace("azure-conv", data) == data / info.filename
    with pytest.warns(W.TraceNotice, match=r"azure-conv is hidden \(\$LABSUPPORT_HIDE_TRACES is set\)"):
        assert W.load_trace("azure-conv", limit=10).synthetic
    assert len(W.load_trace("azure-conv", data / info.filename)) == 1


# ---------------------------------------------------------------------------------------------
# Malformed files are reported with file and line
# ---------------------------------------------------------------------------------------------


def test_malformed_azure_rows_name_file_and_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.68,374,44\n"
                 "2023-11-16 18:15:47.00,abc,44\n"
                 "2023-11-16 18:15:48.00,10\n"
                 "yesterday,5,5\n"
                 "2023-11-16 18:15:49.5,20,-3\n"
                 "2023-11-16 18:15:50.25,30,7\n"
                 "2023-11-16 18:15:45.00,30,7\n")  # before the first row: a negative arrival
    with pytest.raises(W.TraceFormatError, match=f"{p}:3: ContextTokens is not an integer: 'abc'"):
        W.read_azure_csv(p)
    with pytest.warns(W.TraceNotice, match="skipped 5 malformed"):
        w = W.read_azure_csv(p, skip_malformed=True)
    assert [(r.prompt_tokens, r.output_tokens) for r in w] == [(374, 44), (30, 7)]
    assert w[1].arrival_s == pytest.approx(3.57)
    joined = "\n".join(w.notes)
    assert f"{p}:8: TIMESTAMP '2023-11-16 18:15:45.00' is earlier than the first row's" in joined
    for line in (3, 4, 5, 6, 8):
        assert f"{p}:{line}:" in joined
    q = tmp_path / "h.csv"
    q.write_text("time,prompt,out\n1,2,3\n")
    with pytest.raises(W.TraceFormatError, match=f"{q}:1: header .* lacks column"):
        W.read_azure_csv(q)


def test_malformed_mooncake_lines_name_file_and_line(tmp_path):
    p = tmp_path / "t.jsonl"
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    lines = [json.dumps(good), "{not json", json.dumps({**good, "hash_ids": [1]}),
             json.dumps({k: v for k, v in good.items() if k != "output_length"}),
             json.dumps({**good, "input_length": "many"}), json.dumps({**good, "timestamp": 1500}),
             '{"timestamp": NaN, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}']
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(W.TraceFormatError, match=f"{p}:2: not valid JSON"):
        W.read_mooncake_jsonl(p)
    with pytest.warns(W.TraceNotice):
        w = W.read_mooncake_jsonl(p, skip_malformed=True)
    assert len(w) == 2 and w[1].arrival_s == 1.5
    joined = "\n".join(w.notes)
    assert f"{p}:3: hash_ids has 1 ids, expected ceil(600/512) = 2" in joined
    assert f"{p}:4: missing field(s) ['output_length']" in joined
    assert f"{p}:5: input_length is not an integer" in joined
    assert f"{p}:7: timestamp must be a finite, non-negative number of ms, got nan" in joined  # json allows NaN


def test_real_csv_parses_like_the_csv_module(tmp_path):
    """The loader against Python's csv module on a slice of the real file (or a stand-in)."""
    src = REAL["azure-conv"]
    text = src.read_text().splitlines()[:200] if src is not None else (
        ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"2023-11-16 18:15:{i:02d}.5,{i + 1},{i + 2}" for i in range(50)])
    p = tmp_path / "slice.csv"
    p.write_text("\n".join(text) + "\n")
    rows = list(csv.DictReader(io.StringIO("\n".join(text))))
    w = W.read_azure_csv(p)
    assert [(r.prompt_tokens, r.output_tokens) for r in w] == [
        (int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in rows]
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(w.requests, w.requests[1:]))


def test_bad_generator_arguments():
    for call, match in [(lambda: W.chat_workload(0), "num_requests must be >= 1"),
                        (lambda: W.chat_workload(5, prompt_tokens=-1), "prompt_tokens must be >= 1"),
                        (lambda: W.chat_workload(5, rate_per_s=0), "rate_per_s must be positive"),
                        (lambda: W.lognormal_workload(5, output_share=1.5), "output_share"),
                        (lambda: W.load_azure("chat"), "'conv' or 'code'")]:
        with pytest.raises(ValueError, match=match):
            call()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(W.chat_workload(3, rate_per_s=2.0)) == 3


def test_a_lab_shows_the_stand_in_notice_as_one_line_without_paths(tmp_path, monkeypatch, capsys):
    """In a kernel (a lab) the stand-in notice is one printed line in the labs' style, not a stderr warning
    box, and names no folder of this machine (issue 36); scripts and tests still get the TraceNotice."""
    import warnings

    monkeypatch.setattr(W, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.delenv("LABSUPPORT_DATA", raising=False)
    monkeypatch.setenv(W.HIDE_TRACES_ENV, "1")
    monkeypatch.setattr(W, "_in_kernel", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", W.TraceNotice)  # a warning here would fail the test
        w = W.load_trace("azure-conv", limit=100)
    out = capsys.readouterr()
    assert w.synthetic and out.err == ""
    lines = out.out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Note: trace azure-conv is hidden") and "SYNTHETIC" in lines[0]
    assert str(tmp_path) not in lines[0] and "/" not in lines[0].replace("python -m labsupport traces", "")


def test_the_trace_tests_find_the_traces_where_the_labs_do(tmp_path, monkeypatch):
    """$LABSUPPORT_DATA alone (no data/, no ../shared/traces/) is enough for the tests that need a real trace,
    and no test file reads ../shared/traces/ itself (only the lookup's own tests name that folder)."""
    info = W.TRACES["azure-conv"]
    monkeypatch.setattr(W, "REPO_ROOT", tmp_path / "repo")  # a clone with no data/ and nothing beside it
    monkeypatch.delenv(W.HIDE_TRACES_ENV, raising=False)
    monkeypatch.delenv("LABSUPPORT_DATA", raising=False)  # the run's own (a copy's tests run on one) is not this clone's
    assert real_trace("azure-conv") is None
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / info.filename).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    monkeypatch.setenv("LABSUPPORT_DATA", str(tmp_path / "env"))
    assert real_trace("azure-conv") == tmp_path / "env" / info.filename
    monkeypatch.setenv(W.HIDE_TRACES_ENV, "1")
    assert real_trace("azure-conv") is None
    here = Path(__file__).resolve().parent
    direct = [p.name for p in here.glob("test_*.py") if p.name != Path(__file__).name
              and '"shared" / "traces"' in p.read_text(encoding="utf-8")]
    assert direct == [], f"these tests read ../shared/traces/ directly instead of through real_trace(): {direct}"


def test_azure_timestamps_read_as_strptime_reads_them():
    """_parse_time matches "%Y-%m-%d %H:%M:%S" itself (strptime was half of reading a trace): on thousands of drawn
    texts, in range and out of it, it reads or refuses exactly as strptime does."""
    import random
    from datetime import datetime

    from labsupport.workloads import _parse_time

    def by_strptime(text):
        whole, _, frac = text.strip().partition(".")
        t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
        return (t - datetime(1970, 1, 1)).total_seconds() + (float("0." + frac) if frac else 0.0)

    rng = random.Random(37)
    texts = ["2023-11-16 18:15:46.6805900", "2023-1-5 1:2:3", "2024-02-29 23:59:59", "2023-02-29 00:00:00",
             "2023-11-16  18:15:46", "2023-11-16T18:15:46", "2023-11-16 18:15", "023-11-16 18:15:46"]
    texts += [f"{rng.randint(0, 9999):0{rng.choice([1, 4])}d}-{rng.randint(0, 13)}-{rng.randint(0, 32):02d}"
              f"{rng.choice([' ', '  ', 'T'])}{rng.randint(0, 25)}:{rng.randint(0, 61):02d}:{rng.randint(0, 61)}"
              f"{rng.choice(['', '.5', '.6805900'])}" for _ in range(3000)]
    for text in texts:
        try:
            want = by_strptime(text)
        except ValueError:
            with pytest.raises(ValueError):
                _parse_time(text)
        else:
            assert _parse_time(text) == want, text
