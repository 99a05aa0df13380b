"""`python -m labsupport traces` end to end, against an HTTP server on 127.0.0.1 serving small fixture files.

The fixtures are made here, their sha256 computed here with hashlib (independently of the command),
and the registry `labsupport.workloads.TRACES` is replaced in-process by entries pointing at the
loopback server.  The server honours ``Range: bytes=N-`` (206 Partial Content) and can be told to
close the connection halfway through a file or to serve other bytes than the published ones.
"""
from __future__ import annotations

import hashlib
import http.server
import re
import socket
import threading
from dataclasses import replace

import pytest

from labsupport import workloads as W
from labsupport.__main__ import main

CSV = b"TIMESTAMP,ContextTokens,GeneratedTokens\n" + b"".join(
    b"2023-11-16 18:%02d:%02d.000,%d,%d\n" % (m, s, 100 + 7 * (60 * m + s), 1 + (60 * m + s) % 50)
    for m in range(10) for s in range(60))  # 600 rows, about 20 KB: several 64 KiB-chunk-free reads
JSONL = b"".join(b'{"timestamp": %d, "input_length": %d, "output_length": 9, "hash_ids": [%d]}\n' % (i * 10, 100 + i, i)
                 for i in range(300))


class Server:
    """What the handler serves, and what it saw."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.cut_after: dict[str, int] = {}  # name -> close the connection after this many body bytes
        self.ranges: list[str | None] = []
        self.honour_range = True

    def handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                server.ranges.append(self.headers.get("Range"))
                if name not in server.files:
                    self.send_error(404)
                    return
                body, start = server.files[name], 0
                m = server.honour_range and re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if m:
                    start = int(m.group(1))
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                cut = server.cut_after.pop(name, None)
                self.wfile.write(body[start:] if cut is None else body[start:start + cut])
                self.wfile.flush()
                if cut is not None:
                    self.close_connection = True

        return Handler


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A loopback server with two fixture traces; TRACES holds only them; data goes to tmp_path/data."""
    state = Server()
    state.files = {"a.csv": CSV, "b.jsonl": JSONL}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    azure, mooncake = W.TRACES["azure-conv"], W.TRACES["mooncake-conversation"]
    fixtures = {
        "fixture-azure": replace(azure, name="fixture-azure", filename="fixture_azure.csv", upstream_name="a.csv",
                                 url=base + "a.csv", sha256=hashlib.sha256(CSV).hexdigest(), size_bytes=len(CSV)),
        "fixture-mooncake": replace(mooncake, name="fixture-mooncake", filename="fixture_mooncake.jsonl",
                                    upstream_name="b.jsonl", url=base + "b.jsonl",
                                    sha256=hashlib.sha256(JSONL).hexdigest(), size_bytes=len(JSONL)),
    }
    monkeypatch.setattr(W, "TRACES", fixtures)
    monkeypatch.setenv("LABSUPPORT_DATA", str(tmp_path / "data"))
    for name in ("LABSUPPORT_OFFLINE", W.HIDE_TRACES_ENV):
        monkeypatch.delenv(name, raising=False)
    state.base, state.data = base, tmp_path / "data"
    yield state
    httpd.shutdown()
    httpd.server_close()


def run(capsys, *argv):
    code = main(["traces", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def only_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("traces: error: ") and "Traceback" not in err
    return lines[0]


def test_list_then_fetch_then_list(served, capsys):
    code, out, err = run(capsys, "--list")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert re.match(r"fixture-azure +missing +\(\d+ KiB from http://127\.0\.0\.1:\d+/a\.csv\)$", lines[0]), lines[0]
    assert re.match(r"fixture-mooncake +missing ", lines[1]), lines[1]
    assert lines[2].startswith("0 of 2 present;") and lines[2].endswith("fetch them with: python -m labsupport traces")

    code, out, err = run(capsys)
    assert code == 0 and err == "", err
    assert (served.data / "fixture_azure.csv").read_bytes() == CSV
    assert (served.data / "fixture_mooncake.jsonl").read_bytes() == JSONL
    assert sorted(p.name for p in served.data.iterdir()) == ["fixture_azure.csv", "fixture_mooncake.jsonl"]
    assert re.match(rf"fixture-azure: fetched \d+ KiB from {served.base}a\.csv to {served.data}/fixture_azure\.csv",
                    out.splitlines()[0]), out
    assert out.count("(sha256 verified)") == 2 and served.ranges == [None, None]

    code, out, err = run(capsys, "--list")
    assert code == 0 and err == ""
    assert f"fixture-azure     present  {served.data / 'fixture_azure.csv'} (in $LABSUPPORT_DATA; sha256 ok)" in out
    assert out.splitlines()[-1] == "all 2 present"
    # the labs find it now, and read it as the real trace it stands for
    w = W.load_trace("fixture-azure")
    assert not w.synthetic and len(w) == 600 and w[599].prompt_tokens == 100 + 7 * 599

    code, out, err = run(capsys, "fixture-azure")  # present: not fetched again
    assert code == 0 and out.startswith("fixture-azure: already present at ") and len(served.ranges) == 2


def test_corrupted_download_is_refused_and_nothing_is_kept(served, capsys):
    bad = bytearray(JSONL)
    bad[1000] ^= 0x01  # one flipped bit, the size unchanged
    served.files["b.jsonl"] = bytes(bad)
    code, out, err = run(capsys, "fixture-mooncake")
    assert code == 2 and out == ""
    line = only_line(err)
    assert f"refused {served.base}b.jsonl: its sha256 is {hashlib.sha256(bad).hexdigest()}, expected " \
           f"{hashlib.sha256(JSONL).hexdigest()}; the bytes were deleted" in line
    assert list(served.data.iterdir()) == []  # neither the final name nor a partial file
    with pytest.warns(W.TraceNotice, match="SYNTHETIC stand-in"):
        assert W.load_trace("fixture-mooncake", limit=5).synthetic


def test_interrupted_download_resumes_with_a_range_request(served, capsys):
    half = len(CSV) // 2
    served.cut_after["a.csv"] = half
    code, out, err = run(capsys, "fixture-azure")
    assert code == 2 and out == ""
    line = only_line(err)
    assert f"stopped after {half:,} of {len(CSV):,} bytes" in line and "run the command again to resume" in line
    assert not (served.data / "fixture_azure.csv").exists()  # nothing under the final name
    part = served.data / "fixture_azure.csv.part"
    assert part.read_bytes() == CSV[:half]

    code, out, err = run(capsys, "--list", "fixture-azure")
    assert code == 0 and re.search(r"missing +\(\d+ KiB from .*; \d+ KiB of it already fetched\)", out), out

    code, out, err = run(capsys, "fixture-azure")
    assert code == 0 and err == "" and "(sha256 verified)" in out
    assert served.ranges == [None, f"bytes={half}-"]  # the second request asked only for the rest
    assert (served.data / "fixture_azure.csv").read_bytes() == CSV and not part.exists()


def test_a_server_that_ignores_range_sends_the_whole_file_again(served, capsys):
    served.cut_after["b.jsonl"] = 1000
    assert run(capsys, "fixture-mooncake")[0] == 2
    served.honour_range = False  # 200 and the whole body, whatever the Range header asked
    code, out, err = run(capsys, "fixture-mooncake")
    assert code == 0 and err == "" and served.ranges == [None, "bytes=1000-"]
    assert (served.data / "fixture_mooncake.jsonl").read_bytes() == JSONL  # not 1,000 bytes twice


def test_a_kept_partial_file_that_is_not_a_prefix_is_deleted_not_kept(served, capsys):
    served.data.mkdir()
    part = served.data / "fixture_azure.csv.part"
    part.write_bytes(b"X" * 100)  # what some other file left: resuming after it cannot verify
    code, out, err = run(capsys, "fixture-azure")
    assert code == 2 and "its sha256 is" in only_line(err) and served.ranges == ["bytes=100-"]
    assert list(served.data.iterdir()) == []
    code, out, err = run(capsys, "fixture-azure")  # and the next run starts over, from byte 0
    assert code == 0 and (served.data / "fixture_azure.csv").read_bytes() == CSV and served.ranges[-1] is None


def test_unknown_trace_name_is_one_line(served, capsys):
    code, out, err = run(capsys, "fixture-azure", "azure-cnov")
    assert code == 2 and out == ""
    assert only_line(err) == ("traces: error: unknown trace 'azure-cnov'; choose from: fixture-azure, "
                              "fixture-mooncake")
    assert not served.data.exists() and served.ranges == []  # refused before anything was fetched


def test_unreachable_server_is_one_line_and_leaves_nothing(served, capsys, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    info = W.TRACES["fixture-azure"]
    monkeypatch.setitem(W.TRACES, "fixture-azure", replace(info, url=f"http://127.0.0.1:{port}/a.csv"))
    code, out, err = run(capsys, "fixture-azure")
    assert code == 2 and out == ""
    assert only_line(err).startswith(f"traces: error: could not reach http://127.0.0.1:{port}/a.csv (")
    assert not served.data.exists() or not any(served.data.iterdir())


def test_missing_file_upstream_and_offline_are_one_line(served, capsys, monkeypatch):
    del served.files["b.jsonl"]
    code, _, err = run(capsys, "fixture-mooncake")
    assert code == 2 and only_line(err) == f"traces: error: {served.base}b.jsonl answered HTTP 404 Not Found"
    monkeypatch.setenv("LABSUPPORT_OFFLINE", "1")
    code, _, err = run(capsys, "fixture-azure")
    assert code == 2 and "LABSUPPORT_OFFLINE is set, so fixture-azure is not downloaded" in only_line(err)
    assert served.ranges == [None]  # offline: no request at all
    code, out, _ = run(capsys, "--list")  # listing needs no network
    assert code == 0 and out.count("missing") == 2


def test_a_wrong_file_under_the_final_name_is_not_overwritten(served, capsys):
    served.data.mkdir()
    mine = served.data / "fixture_azure.csv"
    mine.write_bytes(b"my own notes")
    code, out, err = run(capsys, "--list", "fixture-azure")
    assert "sha256 DIFFERS from the published file" in out
    code, out, err = run(capsys, "fixture-azure")
    assert code == 2 and "is not the published fixture-azure file" in only_line(err)
    assert mine.read_bytes() == b"my own notes" and served.ranges == []


def test_hidden_traces_are_still_listed_and_the_labs_still_use_stand_ins(served, capsys, monkeypatch):
    assert run(capsys, "fixture-azure")[0] == 0
    monkeypatch.setenv(W.HIDE_TRACES_ENV, "1")
    code, out, _ = run(capsys, "--list", "fixture-azure")
    assert code == 0 and "present" in out and "$LABSUPPORT_HIDE_TRACES is set" in out
    with pytest.warns(W.TraceNotice, match="hidden"):
        assert W.load_trace("fixture-azure", limit=3).synthetic


def test_the_registry_points_at_the_published_files():
    """The real entries: https on the two upstream repositories, a sha256 and a size for each."""
    assert set(W.TRACES) == {"azure-conv", "azure-code", "mooncake-conversation", "mooncake-synthetic"}
    for info in W.TRACES.values():
        assert re.fullmatch(r"https://raw\.githubusercontent\.com/(Azure/AzurePublicDataset/master/data|"
                            r"kvcache-ai/Mooncake/main/FAST25-release/traces)/" + re.escape(info.upstream_name), info.url)
        assert re.fullmatch(r"[0-9a-f]{64}", info.sha256) and info.size_bytes > 100_000


def test_help_names_the_command(capsys):
    assert main(["--help"]) == 0
    assert re.search(r"^  traces +fetch the real traces", capsys.readouterr().out, re.M)


def test_fetch_shows_a_progress_bar_and_leaves_only_the_final_file(served, capsys):
    from labsupport.fetch import fetch

    info = W.TRACES["fixture-azure"]
    path = fetch(info.url, served.data / "x.csv", info.sha256, info.size_bytes, progress=True, label="x")
    err = capsys.readouterr().err
    assert re.search(rf"x: +0%\|.*\| 0\.00/{len(CSV) / 1000:.1f}k \[", err), err  # its size in kB (1e3 B)
    assert path.read_bytes() == CSV and [p.name for p in served.data.iterdir()] == ["x.csv"]
