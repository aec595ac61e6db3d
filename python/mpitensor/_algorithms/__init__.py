"""The distributed algorithms the NumPy entries of mpitensor._ops call, and the
executor's Python face.

_dispatch.py is that face: running an op through the executor, relayouts, dim
maps and the checks every entry shares. The rest move or combine shards for the
entries: row exchanges and picks (_row_exchange, _pick, _roll, _flatten), sample
sort, scans and folds along a sharded axis (_fold, _lanes), merges of partial
results (_merge), the small dense linear algebra on one rank or a subgrid
(_small_linalg, _alike), boolean and integer-array keys (_advanced_index) and the
write-through of copy-views (_views).

This floor registers no NumPy function and never imports mpitensor._ops: an
entry there normalises a call and picks one of these; a new algorithm goes here.
Importing this package imports none of its modules.
"""

__all__: list = []
