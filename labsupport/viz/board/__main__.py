"""`python -m labsupport.viz.board --write`: recompute the board's shipped data (`labsupport.viz.board.map`)."""
import sys

from labsupport.viz.board.map import main

if __name__ == "__main__":
    sys.exit(main())
