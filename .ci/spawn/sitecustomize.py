"""First on PYTHONPATH (`benchmarks/notebook_times.py --start-method spawn`, in `make test-presets`),
this makes every Python process start its subprocesses with `spawn`, macOS's and Windows' default, on
Linux too: the Jupyter kernels it starts, their DataLoader workers, and the children wb.launch starts
(its 'auto' follows it)."""

import multiprocessing

multiprocessing.set_start_method("spawn", force=True)
