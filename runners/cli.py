"""The ``sparse-dist`` command: ``prepare``, ``train``, ``demo``, ``bench spmm`` and ``info``.

Launch under MPI: ``mpiexec -n P sparse-dist demo`` or ``srun --mpi=pmi2
sparse-dist ...``. Any exception on any rank ends the whole job with a
non-zero status and that rank's message (:func:`sparse_dist.comm.run_or_abort`).
"""

from __future__ import annotations

import argparse
import platform
import sys

from sparse_dist import log


def _parser() -> argparse.ArgumentParser:
    from runners import bench_policies, bench_spmm, demo, prepare_cmd, train_cmd

    parser = argparse.ArgumentParser(prog="sparse-dist", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING", help="library log level (default: WARNING)")
    parser.add_argument("--gpu-aware", choices=("on", "off", "auto"), default="auto",
                        help="hand CUDA buffers to MPI directly (on), stage through host memory (off), "
                             "or detect (auto)")
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="distributed SpMM on a built-in graph vs scipy")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.main)
    prepare = commands.add_parser("prepare", help="write a dataset as shards (single process)")
    prepare_cmd.add_arguments(prepare)
    prepare.set_defaults(func=prepare_cmd.main)
    train = commands.add_parser("train", help="distributed full-graph training from shards")
    train_cmd.add_arguments(train)
    train.set_defaults(func=train_cmd.main)
    bench = commands.add_parser("bench", help="benchmarks")
    bench_kinds = bench.add_subparsers(dest="bench", required=True)
    spmm = bench_kinds.add_parser("spmm", help="distributed SpMM vs single-process torch SpMM")
    bench_spmm.add_arguments(spmm)
    spmm.set_defaults(func=bench_spmm.main)
    policies = bench_kinds.add_parser("policies", help="exact vs BNS-GCN sampling vs SANCUS staleness, one run")
    bench_policies.add_arguments(policies)
    policies.set_defaults(func=bench_policies.main)
    info = commands.add_parser("info", help="versions, MPI library, CUDA and CUDA-aware MPI status")
    info.set_defaults(func=_info)
    return parser


def _info(comm: object, args: argparse.Namespace) -> int:
    import numpy
    import scipy
    import torch

    from sparse_dist.comm import Communicator, detect_cuda_aware_mpi, mpi_vendor_details

    assert isinstance(comm, Communicator)
    if comm.rank == 0:
        print(f"python      {platform.python_version()}")
        print(f"torch       {torch.__version__} (threads {torch.get_num_threads()})")
        print(f"numpy       {numpy.__version__}")
        print(f"scipy       {scipy.__version__}")
        for key, value in mpi_vendor_details().items():
            print(f"{key:<13}{value}")
        print(f"world size  {comm.size}")
        cuda = torch.cuda.is_available()
        print(f"cuda        {'available: ' + torch.cuda.get_device_name(0) if cuda else 'not available'}"
              f" (torch built with CUDA {torch.version.cuda})")
        print(f"cuda-aware  detected={detect_cuda_aware_mpi()} in use={comm.gpu_aware} (--gpu-aware {args.gpu_aware})")
        try:
            import cupy  # optional

            print(f"cupy        {cupy.__version__}")
        except ImportError:
            print("cupy        not installed (optional)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    args = _parser().parse_args(argv)
    log.configure(args.log_level)
    from sparse_dist.comm import run_or_abort, world

    def body() -> int:
        comm = world(gpu_aware=args.gpu_aware)
        return args.func(comm, args)

    return run_or_abort(body)


if __name__ == "__main__":
    sys.exit(main())
