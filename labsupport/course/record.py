"""A lab's public record: what check() knows of each checkoff, written by the build (every lab).

``labsupport/course/records/labNN.json`` holds the lab's lecture givens and, per checkoff, its title,
hint, kind, prompts, the cells that are the exercise (by the build's cell ids), the library names its
scan flags (labsupport.course.scan), and a sealed payload: the judge's spec on the lecture's givens
(a value or a choice), or the lab's own cases, each as its input data and its spec (a function).
`python -m labsupport build` writes it from the lab's graders; `build --check` fails when it is stale.

It is the same file in the repository and in the student release, so check() gives the same feedback
in both and never imports a grader.  "Sealed" means compressed and masked so that no answer is found
by a search; it is not secret from a student who decodes it, and need not be: the answers it holds
are those of the lecture's givens and the lab's own cases, and `grade` decides on hidden ones.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import zlib
from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "records"
_LABEL = b"labsupport public record"


def _mask(payload: bytes, lab: int) -> bytes:
    stream = b"".join(hashlib.sha256(_LABEL + bytes([lab]) + i.to_bytes(8, "big")).digest()
                      for i in range(len(payload) // 32 + 1))
    return bytes(a ^ b for a, b in zip(payload, stream))


def seal(payload, lab: int) -> str:
    text = json.dumps(payload, ensure_ascii=True, allow_nan=False, sort_keys=True, separators=(",", ":"))
    return base64.b64encode(_mask(zlib.compress(text.encode(), 9), lab)).decode()


def unseal(text: str, lab: int):
    return json.loads(zlib.decompress(_mask(base64.b64decode(text), lab)))


def path(lab: int) -> Path:
    return FOLDER / f"lab{lab:02d}.json"


def dumps(rec: dict) -> str:
    return json.dumps(rec, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


@functools.lru_cache(maxsize=None)
def read(lab: int) -> dict | None:
    """Lab `lab`'s record (None when the lab has none), its payloads unsealed."""
    p = path(lab)
    if not p.is_file():
        return None
    rec = json.loads(p.read_text(encoding="utf-8"))
    for entry in rec["checkoffs"]:
        entry.update(unseal(entry.pop("sealed"), lab))
    return rec


def entry(checkoff_id: str) -> dict | None:
    rec = read(int(checkoff_id.split(".")[0]))
    return next((e for e in rec["checkoffs"] if e["id"] == checkoff_id), None) if rec else None
