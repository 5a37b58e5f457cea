"""Time the shard checks against the load they guard (docs/results.md, "What checking every array costs").

Run from the repository root on a prepared dataset, e.g.::

    PYTHONPATH=. .venv/bin/python docs/shard_check_cost.py data_prepared/rmat-s20 3

For each part, ``REPEATS`` times (interleaved, the page cache warm after the first pass), it times the whole
:func:`runners.data.shard_reader.read_part` (checksum, headers, ``np.load``, value checks) and, apart, the two
checks alone on the same file and arrays (:func:`member_problem` from the headers, :func:`part_problem` on the
values), and prints per part the median of each and the checks' share of the load.
"""

from __future__ import annotations

import statistics
import sys
import time
import zipfile
from pathlib import Path

from runners.data.part_checks import member_problem, part_problem
from runners.data.shards import part_file, read_meta, read_part


def main(data_dir: str, repeats: int) -> None:
    directory = Path(data_dir)
    meta = read_meta(directory)
    total_load, total_checks = 0.0, 0.0
    print(f"{meta['name']}: {meta['num_nodes']} nodes, {meta['num_edges']} entries, {meta['num_parts']} parts")
    for index in range(meta["num_parts"]):
        loads, checks = [], []
        path = directory / part_file(index)
        for _ in range(repeats):
            start = time.perf_counter()
            arrays = read_part(directory, meta, index)
            loads.append(time.perf_counter() - start)
            start = time.perf_counter()
            with zipfile.ZipFile(path) as archive:
                assert member_problem(archive, path.stat().st_size, meta, index) is None
            assert part_problem(meta, index, arrays) is None
            checks.append(time.perf_counter() - start)
        load, check = statistics.median(loads), statistics.median(checks)
        total_load, total_checks = total_load + load, total_checks + check
        print(f"part {index}: load {load:.3f} s (checks included), checks {check:.3f} s = {100 * check / load:.1f}%")
    print(f"all parts: load {total_load:.3f} s, checks {total_checks:.3f} s = {100 * total_checks / total_load:.1f}% "
          f"of the load")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
