"""Pictures of layouts: plot_sharding (who holds which block) and plot_redistribute
(which rank sends which block to whom), written as PNG files with matplotlib.

Drawing uses matplotlib's object API on an Agg canvas, never pyplot, so it does not
touch the user's backend or open windows.
"""

from __future__ import annotations

import numpy as np

from .. import _args, _comm
from .._layout import plan as plan_for
from ..placement_types import Partial
from ._visualize_sharding import check_drawable, owners_grid, require, shard_blocks

__all__ = ["plot_sharding", "plot_redistribute"]


def plot_sharding(dtensor, path) -> None:
    """Writes a PNG of ``dtensor``'s layout: the global array as a grid of blocks,
    each coloured by the rank(s) holding it and labelled with them, the shape,
    dtype, mesh and placements in the title. 1-D and 2-D DTensors (others:
    RuntimeError); a missing matplotlib is an ImportError on every rank.

    Collective on the mesh: no data moves (the picture needs only the layout), but
    the rank at coordinate 0 of every mesh dim writes the file and the members then
    agree on success, so the file exists when any member returns, and a failure to
    write raises on every member.

    Example (``mpiexec -n 4``)::

        >>> dt = distribute_tensor(np.zeros((4, 4)), mesh, [Shard(0)])
        >>> mpitensor.debug.plot_sharding(dt, "layout.png")
    """
    check_drawable(dtensor, "plot_sharding")
    require("matplotlib", "plot_sharding")
    mesh = dtensor.device_mesh
    blocks = shard_blocks(dtensor.shape, mesh, dtensor.placements)

    def draw(fig):
        ax = fig.add_subplot(1, 1, 1)
        _draw_layout(ax, dtensor.shape, blocks, mesh.device_type)
        ax.set_title(f"{dtensor.shape} {dtensor.dtype} on {mesh!r}\n"
                     f"placements {list(dtensor.placements)}", fontsize=9)

    _write_on_one_rank(mesh, path, draw, "plot_sharding")


def plot_redistribute(src, placements, path) -> list:
    """Writes a PNG of redistributing ``src`` to ``placements``: the source layout
    on the left, the target layout on the right, and an arrow for every block a
    rank receives from another, coloured by the sender; the C planner's steps and
    bytes are listed below. Returns the transfers drawn, the same list on every
    rank: ``[(sender, receiver, ((row_first, row_last), (col_first, col_last)))]``
    in ranks of the mesh's communicator, bounds inclusive. Nothing is
    redistributed.

    Who sends: a block held by one rank comes from it; a replicated block comes
    from the holder whose mesh coordinate is closest to the receiver's (as the
    collectives along one mesh dim do); a Partial block comes from every holder
    (a reduction). A receiver that already holds a block gets no arrow.

    Collective on the mesh, like :func:`plot_sharding` (one rank writes; all agree
    on success). The same argument errors as ``DTensor.redistribute``.

    Example (``mpiexec -n 2``)::

        >>> dt = distribute_tensor(np.zeros((4, 4)), mesh, [Shard(0)])
        >>> mpitensor.debug.plot_redistribute(dt, [Replicate()], "plan.png")
        [(1, 0, ((2, 3), (0, 3))), (0, 1, ((0, 1), (0, 3)))]
    """
    check_drawable(src, "plot_redistribute")
    require("matplotlib", "plot_redistribute")
    mesh = src.device_mesh
    dst = _args.normalize_placements(placements, mesh, src.ndim)
    plan = plan_for(mesh, src.shape, src.placements, dst, src.dtype)  # checks the move
    src_blocks = shard_blocks(src.shape, mesh, src.placements)
    dst_blocks = shard_blocks(src.shape, mesh, dst)
    moves = transfers(mesh, src_blocks, dst_blocks,
                      any(isinstance(p, Partial) for p in src.placements))
    steps = "; ".join(f"{s[0]}" + (f" on mesh dim {s[1]}" if s[1] >= 0 else "")
                      + f": {s[4]} B" for s in plan.steps()) or "no communication"

    def draw(fig):
        left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        colour = _draw_layout(left, src.shape, src_blocks, mesh.device_type)
        _draw_layout(right, src.shape, dst_blocks, mesh.device_type, colour)
        left.set_title(f"source {list(src.placements)}", fontsize=9)
        right.set_title(f"target {list(dst)}", fontsize=9)
        fig.subplots_adjust(bottom=0.2)
        _draw_arrows(fig, left, right, src.shape, moves)
        fig.suptitle(f"redistribute {src.shape} {src.dtype} on {mesh!r}", fontsize=10)
        fig.text(0.5, 0.06, f"transfers (sender->receiver): {_moves_text(moves)}",
                 ha="center", fontsize=7, wrap=True)
        fig.text(0.5, 0.02, f"plan: {steps}", ha="center", fontsize=8, wrap=True)

    _write_on_one_rank(mesh, path, draw, "plot_redistribute")
    return moves


def transfers(mesh, src_blocks, dst_blocks, partial: bool) -> list:
    """Who sends which part of each target block to its receiver (see
    plot_redistribute). Local."""
    coords = {int(rank): coord for coord, rank in np.ndenumerate(mesh.mesh)}
    holders: dict = {}
    for r, c, rank in src_blocks:
        holders.setdefault((r, c), []).append(rank)
    moves = []
    for r, c, receiver in dst_blocks:
        for (sr, sc), ranks in holders.items():
            box = (_overlap(r, sr), _overlap(c, sc))
            if box[0] is None or box[1] is None:
                continue
            if partial:
                senders = [s for s in ranks if s != receiver]
            elif receiver in ranks:
                senders = []
            else:
                senders = [max(ranks, key=lambda s: (_closeness(coords[s], coords[receiver]), -s))]
            moves += [(s, receiver, box) for s in senders]
    return moves


def _overlap(a, b):
    first, last = max(a[0], b[0]), min(a[1], b[1])
    return (first, last) if first <= last else None


def _closeness(a, b) -> int:
    return sum(x == y for x, y in zip(a, b))


def _draw_layout(ax, shape, blocks, device_type, colour=None):
    """Blocks as rectangles (rows down, columns across); returns the colour map
    {owner set: colour} so that two panels colour alike."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    palette = colormaps["tab20"]
    colour = {} if colour is None else colour
    rows, cols, owners = owners_grid(blocks)
    nrows, ncols = shape[0], shape[1] if len(shape) == 2 else 1
    for (r, c), who in owners.items():
        key = tuple(who)
        face = colour.setdefault(key, palette(len(colour) % 20))
        ax.add_patch(Rectangle((c[0], r[0]), c[1] - c[0] + 1, r[1] - r[0] + 1,
                               facecolor=face, edgecolor="black", linewidth=1))
        ax.text((c[0] + c[1] + 1) / 2, (r[0] + r[1] + 1) / 2,
                device_type + ":" + ",".join(map(str, who)), ha="center", va="center",
                fontsize=8)
    ax.set_xlim(0, max(ncols, 1))
    ax.set_ylim(max(nrows, 1), 0)
    ax.set_aspect("equal" if nrows and ncols and max(nrows, ncols) <= 8 * min(nrows, ncols)
                  else "auto")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("columns")
    ax.set_ylabel("rows")
    return colour


def _draw_arrows(fig, left, right, shape, moves) -> None:
    """An arrow per transfer, from the block's place in the source panel to its
    place in the target panel, shifted per receiver so that replicated targets
    stay apart, coloured by sender."""
    from matplotlib import colormaps
    from matplotlib.patches import ConnectionPatch

    palette = colormaps["tab10"]
    receivers = sorted({m[1] for m in moves})
    for sender, receiver, (r, c) in moves:
        y, x = (r[0] + r[1] + 1) / 2, (c[0] + c[1] + 1) / 2
        shift = (receivers.index(receiver) + 1) / (len(receivers) + 1) - 0.5
        end = (x + shift * (c[1] - c[0] + 1) * 0.6, y + shift * (r[1] - r[0] + 1) * 0.6)
        fig.add_artist(ConnectionPatch(
            xyA=(x, y), coordsA=left.transData, xyB=end, coordsB=right.transData,
            arrowstyle="->", color=palette(sender % 10), linewidth=1.2, alpha=0.8,
            connectionstyle="arc3,rad=-0.15"))


def _moves_text(moves, limit: int = 8) -> str:
    text = ", ".join(f"{s}->{d} rows {r[0]}-{r[1]} cols {c[0]}-{c[1]}"
                     for s, d, (r, c) in moves[:limit])
    if len(moves) > limit:
        text += f", and {len(moves) - limit} more"
    return text or "none"


def _write_on_one_rank(mesh, path, draw, what: str) -> None:
    """The rank at coordinate 0 of every mesh dim draws and saves; the members then
    agree on whether it worked (collective on the mesh)."""
    coord = mesh.get_coordinate()
    if coord is None:
        return
    error = None
    if not any(coord):
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            fig = Figure(figsize=(10, 5) if what == "plot_redistribute" else (6, 5))
            FigureCanvasAgg(fig)
            draw(fig)
            fig.savefig(path, format="png", dpi=100)
        except Exception as e:  # reported on every rank below
            error = e
    try:
        _comm.agree(mesh, error is None, 0,
                 f"{what}: writing {path!r} failed on the mesh's first rank (rank "
                 f"{int(mesh.mesh.flat[0])}): {error}", type(error or RuntimeError()))
    except Exception as agreed:  # noqa: BLE001 - the first rank's, on every rank
        raise agreed from error
