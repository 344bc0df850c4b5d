"""`python -m workbench --help`: see cli.py. `python -m workbench notebooks DEST` copies the course's
notebooks out of the installed package (workbench/base/course_files.py)."""

import sys

if sys.argv[1:2] == ["notebooks"]:
    from workbench.base.course_files import main as copy_notebooks

    sys.exit(copy_notebooks(sys.argv[2:]))

import os  # noqa: E402

from .cli import main  # noqa: E402

code = main()
if "LOCAL_RANK" in os.environ:
    # A rank of torchrun or `accelerate launch` leaves as the workbench's own launcher's children do
    # (launching/launch.py): its process group was taken down (cli._leave_process_group), but a C++
    # thread of torch's still met static destruction once in CI after the run had finished and its
    # result was written ('terminate called without an active exception', SIGABRT; the launcher
    # then exits 1). Nothing is left to do at shutdown: the output is flushed and the files closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
