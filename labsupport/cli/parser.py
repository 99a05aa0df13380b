"""The one rule every `python -m labsupport <command>` follows, and the pieces that keep it.

Bad input is one line on stderr naming the flag (or file:line) and the value, and exit code 2; a
valid run is exit code 0; no input gives a traceback.  The pieces:

* `OneLineParser`: argparse whose errors are one line (`UsageError`), never the usage block;
* `int_flag` / `real_flag`: flag types that take plain ASCII numbers only, finite, within a range
  the message states (``nan``, ``inf``, ``1e400``, ``١٢`` and ``True`` are refused by the parser);
* `run_command`: runs a command's body and turns a refusal into the one line and exit code 2;
* `strict_json`: JSON with NaN and Infinity forbidden: an undefined number is ``null``, and the
  output's ``notes`` say why.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys

from labsupport.checks import shown

MAX_MESSAGE = 400  # characters: one readable line, however long the offending value was


class UsageError(Exception):
    """A command-line flag was wrong; the message is the one line to print."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


_INT = re.compile(r"[+-]?[0-9]{1,30}")  # ASCII digits only: int() would take '١٢' and '1_000'
_REAL = re.compile(r"[+-]?(?:[0-9]{1,400}\.?[0-9]{0,400}|\.[0-9]{1,400})(?:[eE][+-]?[0-9]{1,6})?")


def _interval(minimum, maximum, above, below) -> str:
    low = f"({above:g}" if above is not None else f"[{minimum:g}" if minimum is not None else "(-inf"
    high = f"{below:g})" if below is not None else f"{maximum:g}]" if maximum is not None else "inf)"
    return f"{low}, {high}"


def int_flag(minimum: int, maximum: int):
    """An argparse type: a plain integer in [minimum, maximum]."""
    def parse(text: str) -> int:
        s = text.strip()
        value = int(s) if _INT.fullmatch(s) else None
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected an integer in {minimum:,}..{maximum:,}, got {shown(text)}")
        return value
    parse.__name__ = "int"
    return parse


def real_flag(minimum: float | None = None, maximum: float | None = None, *, above: float | None = None,
              below: float | None = None):
    """An argparse type: a finite decimal number in the interval (``above`` and ``below`` exclude their bound)."""
    def parse(text: str) -> float:
        s = text.strip()
        value = float(s) if _REAL.fullmatch(s) else math.nan
        ok = (math.isfinite(value) and (above is None or value > above) and (minimum is None or value >= minimum)
              and (maximum is None or value <= maximum) and (below is None or value < below))
        if not ok:
            raise argparse.ArgumentTypeError(
                f"expected a finite number in {_interval(minimum, maximum, above, below)}, got {shown(text)}")
        return value
    parse.__name__ = "number"
    return parse


def one_line(message, limit: int = MAX_MESSAGE) -> str:
    """The message on one line, cut to `limit` characters: newlines, tabs and terminal escapes are
    shown escaped (a file name or a value may hold any of them)."""
    text = str(message)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_command(prog: str, body, argv) -> int:
    """Run `body(argv)` under the one rule; returns the exit code.

    A `UsageError`, a `ValueError` (every mechanism's refusal of a bad argument) or an `OSError`
    (a file that cannot be read or written) is bad input: one line on stderr, exit code 2.  `--help`
    exits 0.  Anything else is a defect of labsupport, not of the input: still one line, exit code 1.
    """
    try:
        return int(body(argv) or 0)
    except SystemExit as exc:  # argparse after printing --help
        return exc.code if isinstance(exc.code, int) else 0
    except BrokenPipeError:  # the reader went away (`| head`): nothing to report to it
        return 1
    except (UsageError, ValueError, OSError) as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        print(f"{prog}: internal error (a labsupport bug; please report it): {type(exc).__name__}: "
              f"{one_line(exc)}", file=sys.stderr)
        return 1


def strict_json(obj, notes: list[str], path: str = ""):
    """A copy of `obj` that strict JSON can carry: non-finite floats become None, numpy scalars plain.

    Each value set to None gets a line in `notes` unless a note already names its key.
    """
    if isinstance(obj, dict):
        return {k: strict_json(v, notes, f"{path}.{k}" if path else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v, notes, f"{path}[{i}]") for i, v in enumerate(obj)]
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, (str, bytes)):
        obj = obj.item()  # numpy and torch scalars
    if isinstance(obj, float) and not math.isfinite(obj):
        key = path.split(".")[-1].split("[")[0]
        if not any(key in n for n in notes):
            notes.append(f"{path} is undefined for this run ({obj!r} in floating point), so it is null")
        return None
    return obj


def dumps_strict(obj, **kwargs) -> str:
    """json.dumps that refuses NaN and Infinity (call `strict_json` first to map them to null)."""
    return json.dumps(obj, allow_nan=False, **kwargs)
