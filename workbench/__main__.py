"""`python -m workbench --help`: see cli.py. `python -m workbench notebooks DEST` copies the course's
notebooks out of the installed package (workbench/core/course_files.py)."""

import sys

if sys.argv[1:2] == ["notebooks"]:
    from .core.course_files import main as copy_notebooks

    sys.exit(copy_notebooks(sys.argv[2:]))

from .cli import main  # noqa: E402

sys.exit(main())
