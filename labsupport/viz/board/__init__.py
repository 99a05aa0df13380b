"""The map of Part II (§10.7, lab 08) and the instructor's board (lab 99: Lecture 10's 75-minute timing plan).

Lab 08 draws §10.7's "what paging did not fix" table with it, every row computed in `labsupport.measure.part_two`;
lab 99 (notebooks/99_board.ipynb, `make board`, `make present`) stages the lecture one segment at a time:
the room sees the segment's picture and its question; each "reveal" adds the next result in the order the
lecture's notes give (exact figures on the course card, the lecture's print beside them where they differ,
flagged); the instructor's notes travel to the presenter view, never to the projected page.

One role a module:

    map        §10.7's table as HTML (lab 08's, the projector's, the room's), and ``board_data.json``: what
               the board needs from an engine run or a trace, computed once and shipped
               (``python -m labsupport.viz.board --write``; a test checks it against a fresh computation)
    segments   what each segment of the timing plan says and reveals (0–6 §10.1, 6–16 §10.2, 16–36 §10.3,
               36–46 §10.4, 46–58 §10.5, 58–68 §10.6, 68–75 §10.7), every number from the ledger's closed forms
    pictures   one figure per segment, drawn from labsupport (the ledger's arithmetic, real allocator
               states), `step` results revealed; §10.5's swap-or-recompute figure for the labs
    views      one segment as the room sees it (picture, question, results, what-if slider) and the
               instructor's notes, as HTML
    deck       the deck: `Board`, its keyboard widget and the presenter view

The names below are the package's: `from labsupport.viz import board as viz_board` and
`viz_board.map_table_html(...)`, `viz_board.Board()`, `viz_board.SEGMENTS` read as they always have.
"""
from __future__ import annotations

from labsupport.viz.board.deck import BUTTON_CSS, Board, in_voila
from labsupport.viz.board.map import (BOARD_COLUMNS, BOARD_DATA, MAP_COLUMNS, compute_board_data,
                                      load_board_data, main, map_board_html, map_html, map_table_html,
                                      write_board_data)
from labsupport.viz.board.pictures import (BOARD_PX, LOOP_VERBS, PICTURE_HEIGHT, PICTURE_RANGE, PICTURES,
                                           block_size_table_html, block_table_figure, board_sized,
                                           engine_loop_figure, five_jobs_figure, naive_figure, picture,
                                           sharing_figure, slo_figure, swap_recompute_figure)
from labsupport.viz.board.segments import FLAG, Segment, _segments, operating_points
from labsupport.viz.board.views import (TABLE_CSS, TEXT_CSS, WHATIF, SegmentView, ask_html, next_up_html,
                                        notes_html, results_html, segment_view, whatif_readout)

__all__ = [
    "BOARD_COLUMNS", "BOARD_DATA", "BOARD_PX", "BUTTON_CSS", "FLAG", "LOOP_VERBS", "MAP_COLUMNS", "PICTURES",
    "PICTURE_HEIGHT", "PICTURE_RANGE", "SEGMENTS", "TABLE_CSS", "TEXT_CSS", "WHATIF", "Board", "Segment",
    "SegmentView", "ask_html", "block_size_table_html", "block_table_figure", "board_sized", "compute_board_data",
    "engine_loop_figure", "five_jobs_figure", "in_voila", "load_board_data", "main", "map_board_html", "map_html",
    "map_table_html", "naive_figure", "next_up_html", "notes_html", "operating_points", "picture", "results_html",
    "segment_view", "sharing_figure", "slo_figure", "swap_recompute_figure", "whatif_readout", "write_board_data",
]


def __getattr__(name: str):
    """`SEGMENTS` is made on first use, not on import (`labsupport.viz.board.segments`: lab 08 imports the
    package for its map, and the ledger command's whole-scenario answers are staff-only)."""
    if name == "SEGMENTS":
        return _segments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
