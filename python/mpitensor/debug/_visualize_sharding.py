"""visualize_sharding: which rank holds which block of a 1-D or 2-D DTensor, as a
table in the terminal."""

from __future__ import annotations

import importlib

import numpy as np

from .. import _strided
from .._layout import local_shape_and_global_offset

__all__ = ["visualize_sharding"]

# Background colours of the rich table, one per distinct set of owners.
_PALETTE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
            "#e6550d", "#31a354", "#756bb1", "#636363", "#6baed6", "#fd8d3c")


def require(package: str, what: str):
    """Imports ``package`` or raises an ImportError that says how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise ImportError(
            f"{what} needs the `{package}` package: pip install {package}"
        ) from e


def check_drawable(dtensor, what: str) -> None:
    if dtensor.ndim not in (1, 2):
        raise RuntimeError(
            f"{what} supports only 1D or 2D DTensor, got a {dtensor.ndim}-D one of "
            f"shape {dtensor.shape}"
        )


def shard_blocks(shape, mesh, placements) -> list:
    """``[((row_first, row_last), (col_first, col_last), rank)]`` of every mesh rank
    holding at least one element (inclusive bounds; a 1-D tensor is one column),
    in mesh order. Local: from the layout alone."""
    blocks = []
    if _strided.has_strided(placements):
        return _strided_blocks(shape, mesh, placements)
    for coord, rank in np.ndenumerate(mesh.mesh):
        size, offset = local_shape_and_global_offset(shape, mesh.shape, coord, placements)
        if len(shape) == 1:
            size, offset = (size[0], 1), (offset[0], 0)
        if size[0] == 0 or size[1] == 0:
            continue
        blocks.append(((offset[0], offset[0] + size[0] - 1),
                       (offset[1], offset[1] + size[1] - 1), int(rank)))
    return blocks


def _runs(indices) -> list:
    """Inclusive (first, last) of each run of consecutive indices."""
    cuts = np.flatnonzero(np.diff(indices) != 1) + 1
    return [(int(r[0]), int(r[-1])) for r in np.split(indices, cuts) if len(r)]


def _strided_blocks(shape, mesh, placements) -> list:
    """shard_blocks of a strided layout: a rank holds one block per pair of runs
    of the indices it holds along the rows and the columns."""
    blocks = []
    for coord, rank in np.ndenumerate(mesh.mesh):
        held = _strided.held_indices(shape, placements, mesh.shape, coord)
        rows = _runs(np.sort(held[0]))
        cols = _runs(np.sort(held[1])) if len(shape) > 1 else [(0, 0)]
        blocks.extend((r, c, int(rank)) for r in rows for c in cols)
    return blocks


def owners_grid(blocks) -> tuple[list, list, dict]:
    """(row ranges, column ranges, {(row range, col range): [ranks]}), sorted."""
    rows = sorted({b[0] for b in blocks})
    cols = sorted({b[1] for b in blocks})
    owners: dict = {}
    for r, c, rank in blocks:
        owners.setdefault((r, c), []).append(rank)
    return rows, cols, owners


def _table_text(blocks, device_type: str) -> str:
    tabulate = require("tabulate", "visualize_sharding").tabulate
    rows, cols, owners = owners_grid(blocks)
    cells = [[device_type + ":" + ",".join(map(str, owners[(r, c)])) if (r, c) in owners
              else "" for c in cols] for r in rows]
    return tabulate(cells, headers=[f"Col {c[0]}-{c[1]}" for c in cols],
                    showindex=[f"Row {r[0]}-{r[1]}" for r in rows])


def _print_rich(blocks, device_type: str, header: str) -> None:
    from rich.console import Console
    from rich.table import Table

    rows, cols, owners = owners_grid(blocks)
    colours: dict = {}
    table = Table(title=header or None, show_lines=True)
    table.add_column("")
    for c in cols:
        table.add_column(f"Col {c[0]}-{c[1]}", justify="center")
    for r in rows:
        cells = []
        for c in cols:
            who = tuple(owners.get((r, c), ()))
            colour = colours.setdefault(who, _PALETTE[len(colours) % len(_PALETTE)])
            text = device_type + ":" + ",".join(map(str, who)) if who else ""
            cells.append(f"[white on {colour}] {text} [/]" if who else "")
        table.add_row(f"Row {r[0]}-{r[1]}", *cells)
    Console().print(table)


def visualize_sharding(dtensor, header: str = "", use_rich: bool = False) -> None:
    """Prints which ranks hold which block of a 1-D or 2-D DTensor.

    Local: no communication. Printed once per mesh, by the rank whose coordinate is
    0 on every mesh dim (other ranks print nothing), as a table of inclusive
    ``Row a-b`` x ``Col c-d`` blocks whose cells name the ranks holding the block
    (``cpu:0,2``); uneven shards appear with their real extents, and ranks whose
    shard is empty appear nowhere. ``header`` is printed first when given. Uses
    ``tabulate``, or ``rich`` with ``use_rich=True``; a missing package is an
    ImportError that names it. An empty DTensor prints nothing; 3-D and more is a
    RuntimeError.

    Example (``mpiexec -n 4``)::

        >>> mesh = init_device_mesh("cpu", (2, 2))
        >>> dt = distribute_tensor(np.zeros((4, 4)), mesh, [Shard(0), Replicate()])
        >>> visualize_sharding(dt)
                     Col 0-3
        -------  ---------
        Row 0-1  cpu:0,1
        Row 2-3  cpu:2,3
    """
    check_drawable(dtensor, "visualize_sharding")
    mesh = dtensor.device_mesh
    # The package check comes before the early returns, so every rank raises alike.
    require("rich" if use_rich else "tabulate",
            "visualize_sharding(use_rich=True)" if use_rich else "visualize_sharding")
    coord = mesh.get_coordinate()
    if dtensor.size == 0 or coord is None or any(coord):
        return
    blocks = shard_blocks(dtensor.shape, mesh, dtensor.placements)
    if use_rich:
        _print_rich(blocks, mesh.device_type, header)
        return
    if header:
        print(header)
    print(_table_text(blocks, mesh.device_type))
