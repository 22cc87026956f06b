"""`verispec bench`: speculative decoding measured against plain decoding, peers and the ideal.

Python entry point: `run_bench(BenchConfig(...), Models(target, draft))` then `write_outputs(result, folder)`.
"""

from .config import BenchConfig
from .report import write_outputs
from .runner import BenchResult, Models, run_bench
from .summary import MethodSummary, summarize

__all__ = ["BenchConfig", "BenchResult", "MethodSummary", "Models", "run_bench", "summarize", "write_outputs"]
