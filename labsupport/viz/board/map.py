"""§10.7's map of Part II as a table, and the board's shipped data (lab 08; lab 99's 68–75 segment).

Every row of §10.7's "what paging did not fix" table is computed in `labsupport.measure.part_two` (`map_rows`,
from the real mechanisms, traces and engine runs); this module draws it: in full beside the lab that
computed each quantity first (`map_table_html`, lab 08), in large type for the projector
(`map_board_html`), and as the room's two columns in the board's last segment (`map_html`).

What on the board needs an engine run or a trace (the 58–68 segment's TTFT bars, the map's trace-bound
values) is computed once and shipped beside this module as ``board_data.json``: written by
``python -m labsupport.viz.board --write`` (`main`), read by `load_board_data`, checked by a test against
a fresh computation.
"""
from __future__ import annotations

import html
import json
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from labsupport.measure.part_two import MapRow, map_rows, trace_numbers
from labsupport.viz import FONT_SIZE, TITLE_SIZE

BOARD_DATA = Path(__file__).with_name("board_data.json")


# --- the quantities of §10.7's rows -------------------------------------------------------------------

MAP_COLUMNS = ("still broken after today", "the quantity", "its value here", "where it goes", "computed in")
BOARD_COLUMNS = ("the quantity", "its value here", "where it goes")  # the projector's three


def map_table_html(rows: Sequence[MapRow], links: bool = True, columns: Sequence[str] = MAP_COLUMNS,
                   font_px: int = FONT_SIZE - 2) -> str:
    """§10.7's table as HTML (it renders in every front end; a plotly Table in a widget drew blank cells)."""
    unknown = [c for c in columns if c not in MAP_COLUMNS]
    if unknown:
        raise ValueError(f"unknown map columns {unknown}; choose from {MAP_COLUMNS}")
    style = f"font-size:{font_px}px;padding:6px 12px;text-align:left;vertical-align:top"
    out = ['<table style="border-collapse:collapse">',
           "<tr>" + "".join(f'<th style="{style}">{h}</th>' for h in columns) + "</tr>"]
    for r in rows:
        cells = dict(zip(MAP_COLUMNS, (html.escape(r.broken), f"<b>{html.escape(r.quantity)}</b>",
                                       html.escape(r.value), html.escape(r.where),
                                       r.lab_link if links else f"lab {r.lab}")))
        out.append("<tr>" + "".join(f'<td style="{style}">{cells[c]}</td>' for c in columns) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def map_board_html(rows: Sequence[MapRow]) -> str:
    """§10.7 for the projector: the quantity, its value and the date that attacks it, in large type."""
    title = f'<div style="font-size:{TITLE_SIZE}px;margin:8px 0">What paging did not fix: the map of Part II</div>'
    return title + map_table_html(rows, links=False, columns=BOARD_COLUMNS, font_px=FONT_SIZE + 2)


def map_html(data: dict) -> str:
    """§10.7 for the room: the quantity today's arithmetic leaves, and the date that attacks it."""
    rows = map_rows(data["map"])
    body = "".join(f"<tr><td>{html.escape(r.quantity)}</td><td><b>{html.escape(r.where)}</b></td></tr>" for r in rows)
    return ('<div class="board-caption">What paging did not fix</div>'
            f'<table class="board-table"><tr><th>the quantity</th><th>where it goes</th></tr>{body}</table>')


# --- board data: computed once, shipped, checked by a test ------------------------------------------

def compute_board_data() -> dict:
    """Everything on the board that needs an engine run or a trace (seconds to compute)."""
    from labsupport.viz.slo import chat_with_probe

    ttft = {}
    for rate in (10, 62):
        run = chat_with_probe(rate)
        ttft[str(rate)] = [asdict(s) for s in run.splits()]
    return {"ttft_splits": ttft, "map": trace_numbers()}


def load_board_data(path: Path = BOARD_DATA) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m labsupport.viz.board --write`")
    return json.loads(path.read_text(encoding="utf-8"))


def write_board_data(path: Path = BOARD_DATA) -> dict:
    data = compute_board_data()
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data


def main(argv: list[str] | None = None) -> int:
    """`python -m labsupport.viz.board --write`: recompute board_data.json (engine runs, traces)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m labsupport.viz.board")
    p.add_argument("--write", action="store_true", help=f"recompute and write {BOARD_DATA.name}")
    args = p.parse_args(argv)
    if args.write:
        write_board_data()
        print(f"wrote {BOARD_DATA}")
    else:
        print(json.dumps(load_board_data(), indent=1, sort_keys=True))
    return 0
