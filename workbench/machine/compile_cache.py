"""One torch.compile (inductor) cache per CPU instruction set, so a capped run never loads kernels
built for another.

Inductor keys its on-disk cache (compiled graphs and their C++ kernels, under
`$TMPDIR/torchinductor_<user>` by default) without the vector ISA it wrote the kernels for. The
ISA follows `ATEN_CPU_CAPABILITY` (how CI and a learner emulate an AVX2-only CPU on a newer one:
README). Measured with torch 2.13 on an AVX-512 CPU: a tiny MLP compiled once uncapped, then run
again with `ATEN_CPU_CAPABILITY=avx2` on the same cache, trained on wrong numbers (first logged loss
2.518 instead of eager's 2.474, and no error). With one directory per capability each cache only
ever holds kernels of one ISA. The folder also names the CPU (a hash of its flags) and is used
uncapped too ('native'): the default folder may already hold kernels of another ISA (a crash was
seen here loading such a mix uncapped), and a copied machine image may bring another CPU's.

Inductor loads what it finds in the folder without checking it: a wrapper or kernel file that was
swapped or corrupted fails the first step from inside the cache (torch 2.13: `BackendCompilerFailed:
backend='inductor' raised:` over a screen of frames). `damaged_cache(error)` turns that into one line
naming the folder and the fix; `run()` and `wb.monitor` raise it.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import tempfile
import traceback

CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
CAPABILITY_VARIABLE = "ATEN_CPU_CAPABILITY"
# The folder workbench chose, beside CACHE_VARIABLE: a child started with another cap (a capped
# kernel under `benchmarks/notebook_times.py --isa avx2`) inherits both and chooses again, where
# a folder the user set (CACHE_VARIABLE alone) is kept. Without it that kernel ran the parent's
# native AVX-512 kernels under ATEN_CPU_CAPABILITY=avx2: SystemError in notebook 08 (measured).
CHOSEN_VARIABLE = "WORKBENCH_INDUCTOR_CACHE_DIR"


def _user() -> str:
    try:
        return re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, ModuleNotFoundError, OSError):  # a container user with no passwd entry
        return f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"


def cpu_flags_line() -> str:
    """/proc/cpuinfo's feature-flags line (Linux; '' elsewhere). Read here without torch, so that
    `import workbench` stays cheap; `hardware` parses the same line. The cache folder names it: a
    cache copied to another machine (an image, a CI runner started from a snapshot) must not hand
    AVX-512 kernels to an AVX2-only CPU."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def inductor_cache_dir(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The cache folder this process should use, named after the capability cap ('native' without
    one) and this CPU's flags; None where the user chose a folder.

        >>> "_aten-avx2_" in inductor_cache_dir({"ATEN_CPU_CAPABILITY": "avx2"})
        True
        >>> inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/mine"}) is None
        True
        >>> chosen = inductor_cache_dir({})  # a parent's choice, inherited by a capped child:
        >>> "_aten-avx2_" in inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": chosen, "WORKBENCH_INDUCTOR_CACHE_DIR": chosen,
        ...                                       "ATEN_CPU_CAPABILITY": "avx2"})
        True
    """
    if environ.get(CACHE_VARIABLE) and environ.get(CACHE_VARIABLE) != environ.get(CHOSEN_VARIABLE):
        return None
    capability = re.sub(r"[^a-z0-9]", "_", environ.get(CAPABILITY_VARIABLE, "").strip().lower()) or "native"
    cpu = hashlib.sha256(cpu_flags_line().encode()).hexdigest()[:8]
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}_aten-{capability}_{cpu}")


def separate_capped_cache(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Point inductor at `inductor_cache_dir()` before anything compiles (called when workbench is
    imported; children of `accelerate launch` inherit the variable). Returns the folder it set."""
    folder = inductor_cache_dir(environ)
    if folder is not None:
        environ[CACHE_VARIABLE] = environ[CHOSEN_VARIABLE] = folder
    return folder


class DamagedCompileCache(RuntimeError):
    """torch.compile failed loading a damaged file from its cache folder: the message names the
    folder and the fix. The error it came from is its __cause__."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows: this line, not inductor's frames (the cause stays on the exception)."""
        return [f"DamagedCompileCache: {self}"]


def damaged_cache(error: BaseException,
                  environ: dict[str, str] | os._Environ = os.environ) -> DamagedCompileCache | None:
    """The one-line error for `error` when loading a file of inductor's cache folder failed: a file
    of the folder that raised while it was loaded (module level), or an OSError / ImportError /
    SyntaxError naming one (an .so that is not a library). Not an error raised while compiled code
    ran (its frames are in the folder too): None for that and any other error. The cause it names
    is the innermost (inductor wraps it in `BackendCompilerFailed`)."""
    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}")  # torch's, where none is set
    folder = os.path.abspath(environ.get(CACHE_VARIABLE) or default)
    seen, chain, inside = set(), [error], []
    while chain:
        current = chain.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        places = [frame.filename for frame in traceback.extract_tb(current.__traceback__) if frame.name == "<module>"]
        places.append(str(getattr(current, "filename", "") or ""))
        if isinstance(current, (OSError, ImportError)):
            places.append(str(current))
        if any(folder + os.sep in place for place in places):
            inside.append(current)
        chain += [current.__cause__, current.__context__, getattr(current, "inner_exception", None)]
    if not inside:
        return None
    said = str(inside[-1]).strip().splitlines()
    cause = f"{type(inside[-1]).__name__}: {said[0][:120]}" if said else type(inside[-1]).__name__
    return DamagedCompileCache(f"torch.compile failed loading its cache folder '{folder}' ({cause}): a file there "
                               f"is damaged; delete the folder (rm -rf '{folder}') and run again, and torch.compile "
                               "rebuilds it")
