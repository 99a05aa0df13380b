"""Fetch one published file, verified and resumable: how the real traces reach data/ (§10.2–§10.5).

`fetch(url, dest, sha256, size)` writes into ``dest.part`` beside the final name and renames it to
`dest` only once all `size` bytes are there and their sha256 matches, so nothing half-written ever
sits under the final name.  An interrupted transfer keeps the ``.part`` file; the next call asks
the server for the rest with an HTTP ``Range: bytes=<have>-`` header (and starts over when the
server ignores it).  Bytes that do not hash to `sha256` are deleted, never kept.

Every refusal is a `FetchError` (an `OSError`, so a command reports it in one line, exit code 2).
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["FetchError", "fetch", "partial_path", "sha256_of"]

CHUNK = 1 << 16
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class FetchError(OSError):
    """The file could not be fetched; the message says why, in one line, and what to do."""


def partial_path(dest: Path) -> Path:
    """Where the bytes fetched so far are kept until the whole file is verified."""
    return dest.with_name(dest.name + ".part")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _open(url: str, start: int, timeout: float):
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:  # the kept bytes do not fit what the server now has: start over
            return None
        raise FetchError(f"{url} answered HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise FetchError(f"could not reach {url} ({reason})") from None


def _resumes_at(resp, start: int, size: int) -> int:
    """The offset the response's body starts at: `start` for a 206 that says so, 0 for a whole file."""
    if not start or resp.status != 206:
        return 0
    m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
    if not m or int(m.group(1)) != start or (m.group(3) != "*" and int(m.group(3)) != size):
        raise FetchError(f"{resp.url} answered a range request with Content-Range "
                         f"{resp.headers.get('Content-Range')!r}, not bytes {start}-{size - 1}/{size}")
    return start


def fetch(url: str, dest: str | os.PathLike, sha256: str, size: int, *, timeout: float = 30.0,
          progress: bool | None = None, label: str = "") -> Path:
    """Fetch `url` to `dest`, resuming a kept ``.part`` file; returns `dest` once its sha256 matches.

    `progress`: a tqdm bar on stderr (None: only when stderr is a terminal).
    """
    from tqdm.auto import tqdm

    dest = Path(dest)
    part = partial_path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    if have > size:  # not a prefix of this file: useless
        part.unlink()
        have = 0
    resp = None
    if have < size:
        resp = _open(url, have, timeout)
        if resp is None:
            part.unlink()
            have = 0
            resp = _open(url, 0, timeout)
    with tqdm(total=size, initial=have, unit="B", unit_scale=True, unit_divisor=1000, desc=label or dest.name,
              file=sys.stderr, disable=None if progress is None else not progress, leave=False) as bar:
        if resp is not None:
            with resp:
                start = _resumes_at(resp, have, size)
                if start != have:
                    bar.reset()
                have = start
                with open(part, "r+b" if start and part.exists() else "wb") as f:
                    f.seek(start)
                    f.truncate()
                    try:
                        while have <= size and (chunk := resp.read(CHUNK)):
                            f.write(chunk)
                            have += len(chunk)
                            bar.update(len(chunk))
                    except (OSError, http.client.HTTPException) as e:
                        f.flush()
                        raise FetchError(f"the download of {url} stopped after {have:,} of {size:,} bytes ({e}); "
                                         f"run the command again to resume") from None
    if have < size:
        raise FetchError(f"the download of {url} stopped after {have:,} of {size:,} bytes (the server closed "
                         f"the connection); run the command again to resume")
    got = sha256_of(part)
    if have > size or got != sha256:
        part.unlink()
        what = f"{have:,} bytes, expected {size:,}" if have > size else f"its sha256 is {got}, expected {sha256}"
        raise FetchError(f"refused {url}: {what}; the bytes were deleted (the published file changed, or the "
                         f"transfer was corrupted: run the command again)")
    os.replace(part, dest)
    return dest
