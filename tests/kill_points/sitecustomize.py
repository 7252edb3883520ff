"""A kill point for tests/test_kill_matrix.py, loaded by every Python process of a command whose
``PYTHONPATH`` starts with this folder (``sitecustomize`` is imported at interpreter start).

``VASCL_TEST_PAUSE`` (JSON, set only in the environment of the run to be killed) names a
filesystem call: ``{"call": "os.replace" | "os.rename" | "os.mkdir" | "open", "path": REGEX,
"nth": N, "rank": R, "pid_file": PATH}``. Just before the ``nth`` call of that function whose
path arguments match ``REGEX`` (searched in ``"SRC -> DST"`` for a rename or replace, in the
path otherwise; ``open`` counts only opening for writing), in the process whose ``RANK`` is
``R`` (any process without ``rank``), the process writes its pid to ``PATH`` and stops itself
with SIGSTOP. The test then SIGKILLs it there: the kill lands at that point exactly, not
wherever a sleep ended. Without the variable this module does nothing.

With ``"fail": "ENOSPC"`` instead of ``pid_file``, that call raises ``OSError(ENOSPC)`` (a full
disk), and so does every later matching call, as they would on a disk that stays full.
"""

import builtins
import errno
import io
import json
import os
import re
import signal


def _install(spec: dict) -> None:
    if "rank" in spec and os.environ.get("RANK") != str(spec["rank"]):
        return
    pattern = re.compile(spec["path"])
    nth = int(spec.get("nth", 1))
    seen = 0
    real_replace, real_open = os.replace, builtins.open

    def pause_at(described: str) -> None:
        nonlocal seen
        if not pattern.search(described):
            return
        seen += 1
        if "fail" in spec and seen >= nth:
            code = getattr(errno, spec["fail"])
            raise OSError(code, os.strerror(code), described)
        if seen != nth:
            return
        staging = spec["pid_file"] + ".tmp"
        with real_open(staging, "w") as handle:
            handle.write(f"{os.getpid()}\n{described}\n")
        real_replace(staging, spec["pid_file"])
        os.kill(os.getpid(), signal.SIGSTOP)

    call = spec["call"]
    if call in ("os.replace", "os.rename"):
        real = getattr(os, call.split(".")[1])

        def moved(src, dst, *args, **kwargs):
            pause_at(f"{os.fsdecode(src)} -> {os.fsdecode(dst)}")
            return real(src, dst, *args, **kwargs)

        setattr(os, call.split(".")[1], moved)
    elif call == "os.mkdir":
        real_mkdir = os.mkdir

        def made(path, *args, **kwargs):
            pause_at(os.fsdecode(path))
            return real_mkdir(path, *args, **kwargs)

        os.mkdir = made
    elif call == "open":

        def opened(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and any(flag in mode for flag in "wax+"):
                pause_at(os.fsdecode(file))
            return real_open(file, mode, *args, **kwargs)

        builtins.open = io.open = opened  # io.open: what pathlib's Path.open calls
    else:
        raise ValueError(f"VASCL_TEST_PAUSE: unknown call {call!r}")


if os.environ.get("VASCL_TEST_PAUSE"):
    _install(json.loads(os.environ["VASCL_TEST_PAUSE"]))
