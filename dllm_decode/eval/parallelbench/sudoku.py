"""4x4 Sudoku solutions by enumeration: the validity check, all 288 grids, completions."""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Final

SUDOKU_SIDE: Final[int] = 4
SUDOKU_BOX: Final[int] = 2
SUDOKU_DIGITS: Final[str] = "1234"


def is_sudoku_solution(grid: str) -> bool:
    """Whether 16 row-major characters form a solved 4x4 Sudoku (rows, columns, 2x2 boxes)."""
    side, box = SUDOKU_SIDE, SUDOKU_BOX
    if len(grid) != side * side or not set(grid) <= set(SUDOKU_DIGITS):
        return False
    cells = [grid[r * side : (r + 1) * side] for r in range(side)]
    groups = [set(row) for row in cells]
    groups += [{cells[r][c] for r in range(side)} for c in range(side)]
    groups += [
        {cells[br + r][bc + c] for r in range(box) for c in range(box)}
        for br in range(0, side, box)
        for bc in range(0, side, box)
    ]
    return all(len(group) == side for group in groups)


@lru_cache(maxsize=1)
def sudoku_solutions() -> tuple[str, ...]:
    """All 288 solved 4x4 grids, each as 16 digit characters (row-major), in sorted order."""
    rows = ["".join(p) for p in itertools.permutations(SUDOKU_DIGITS)]
    grids: list[str] = []

    def extend(prefix: str) -> None:  # depth-first over rows, pruning invalid partial grids
        if len(prefix) == SUDOKU_SIDE**2:
            grids.append(prefix)
            return
        for row in rows:
            if _rows_compatible(prefix + row):
                extend(prefix + row)

    extend("")
    return tuple(grids)


def _rows_compatible(partial: str) -> bool:
    """Whether the complete rows in ``partial`` break no column or box constraint."""
    side, box = SUDOKU_SIDE, SUDOKU_BOX
    n_rows = len(partial) // side
    for c in range(side):
        column = partial[c::side]
        if len(set(column)) != len(column):
            return False
    for br in range(0, n_rows - n_rows % box, box):
        for bc in range(0, side, box):
            cells = {partial[(br + r) * side + bc + c] for r in range(box) for c in range(box)}
            if len(cells) != box * box:
                return False
    return True


@lru_cache(maxsize=1)
def _solution_masks() -> dict[tuple[int, str], int]:
    """Bitmask over :func:`sudoku_solutions` of the grids holding digit ``d`` at cell ``i``."""
    masks: dict[tuple[int, str], int] = {}
    for bit, grid in enumerate(sudoku_solutions()):
        for i, digit in enumerate(grid):
            masks[i, digit] = masks.get((i, digit), 0) | (1 << bit)
    return masks


def sudoku_completions(puzzle: str) -> list[str]:
    """Solutions (16-char strings) consistent with ``puzzle`` (16 chars, ``0`` = blank)."""
    if len(puzzle) != SUDOKU_SIDE**2:
        raise ValueError(f"expected {SUDOKU_SIDE**2} cells, got {len(puzzle)}: {puzzle!r}")
    solutions = sudoku_solutions()
    alive = (1 << len(solutions)) - 1
    for i, value in enumerate(puzzle):
        if value != "0":
            alive &= _solution_masks().get((i, value), 0)
    return [grid for bit, grid in enumerate(solutions) if alive >> bit & 1]
