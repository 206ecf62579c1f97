"""Starting a local Ray instance that does not hang when its raylet dies while starting.

On a loaded machine the raylet can die inside its constructor: it gives its dashboard agent a
fixed 15 s to write its port files (``NodeManager::WaitForDashboardAgentPorts``, not a
setting), and a Python agent importing Ray on two busy cores can take longer. ``ray.init`` then
waits for the dead raylet to register with the GCS. Usually that wait ends after 30 s with
"the current node timed out during startup", and nothing more; in about one start in four here
it did not end at all (the main thread looping in ``GlobalStateAccessor::GetNode`` for minutes,
which is how ``hnce train`` hung for 600 s in two test runs), and a thread cannot interrupt it:
stopping the instance's GCS makes Ray end the whole process a minute later.

So :func:`start_local_instance` runs ``ray.init`` while a watcher thread follows the instance's
raylet. When ``ray.init`` raises and the raylet is dead, the instance's other processes (GCS,
monitor, dashboard, log monitor) are stopped, the raylet's fatal log line is logged with its
file and line, and a new instance is started. When the raylet is dead and ``ray.init`` has not
returned :data:`STUCK_SECONDS` later, the watcher stops the instance's processes and runs this
process's command again in its place (``exec``, same pid and output, its environment counting
the attempt). After :data:`LOCAL_START_ATTEMPTS` starts the error names the log line.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import NoReturn

import psutil
from ray._common.utils import get_default_ray_temp_dir

logger = logging.getLogger(__name__)

#: Starts of a local instance tried before giving up (in this process or after an ``exec``).
LOCAL_START_ATTEMPTS = 2
#: How long ``ray.init`` may go on after its raylet died before the process starts over (Ray's
#: own wait is meant to end 30 s after the raylet started; one waiting for its agent dies 15 s in).
STUCK_SECONDS = 45.0
#: The environment variable that tells a command started over which start it is on.
ATTEMPT_VARIABLE = "HNCE_RAY_START_ATTEMPT"
#: The exit status of a process whose last start got stuck (sysexits' EX_UNAVAILABLE).
EXIT_STUCK = 69
#: A fatal line of a Ray C++ log: ``[2026-11-28 14:49:37,827 C 19723 19723] (raylet) ...``.
_FATAL_LOG_LINE = re.compile(r"^\[[^\]]* C \d+ \d+\] ")
_POLL_SECONDS = 0.2
_STOP_SECONDS = 10.0


class RayStartError(RuntimeError):
    """A local Ray instance could not be started; the message names the log line that says why."""


def start_local_instance(ray_init: Callable[[], None]) -> None:
    """Call ``ray_init`` (a ``ray.init`` that starts a new local instance) until it starts one
    whose raylet lives, at most :data:`LOCAL_START_ATTEMPTS` times (module docstring)."""
    first = min(int(os.environ.pop(ATTEMPT_VARIABLE, "1")), LOCAL_START_ATTEMPTS)
    for attempt in range(first, LOCAL_START_ATTEMPTS + 1):
        watcher = _RayletWatcher(attempt)
        watcher.start()
        try:
            ray_init()
            return
        except Exception as error:
            session = _newest_own_session()
            if session is None or _raylet_alive(session.name):
                raise
            _stop_session(session.name)
            why = f"Ray's raylet died while starting: {raylet_fatal_line(session)}"
            if attempt == LOCAL_START_ATTEMPTS:
                raise RayStartError(f"{why} ({attempt} attempts)") from error
            logger.warning("%s; starting a new local instance (attempt %d)", why, attempt + 1)
        finally:
            watcher.finish()


class _RayletWatcher(threading.Thread):
    """Follows the raylet a ``ray.init`` of this process starts; once it has been dead for
    :data:`STUCK_SECONDS` while ``ray.init`` still runs, starts the process over."""

    def __init__(self, attempt: int) -> None:
        super().__init__(name="hnce-raylet-watcher", daemon=True)
        self.attempt = attempt
        self._finished = threading.Event()
        self._known = {child.pid for child in psutil.Process().children() if _is_raylet(child)}

    def finish(self) -> None:
        self._finished.set()
        self.join()

    def run(self) -> None:
        raylet = None
        while raylet is None:
            if self._finished.wait(_POLL_SECONDS):
                return
            new = [c for c in psutil.Process().children() if c.pid not in self._known]
            raylet = next((child for child in new if _is_raylet(child)), None)
        while _is_running(raylet):
            if self._finished.wait(_POLL_SECONDS):
                return
        if self._finished.wait(STUCK_SECONDS):
            return
        _start_over(_newest_own_session(), self.attempt)


def _start_over(session: Path | None, attempt: int) -> NoReturn:
    """Stop the stuck instance and run this process's command again in its place (same pid,
    same output), or, after the last attempt, end the process naming the raylet's log line."""
    where = raylet_fatal_line(session) if session is not None else "no session directory"
    why = (
        f"Ray's raylet died while starting: {where}; ray.init has not returned "
        f"{STUCK_SECONDS:g} s later"
    )
    if session is not None:
        _stop_session(session.name)
    if attempt >= LOCAL_START_ATTEMPTS:
        logger.error("%s (%d attempts); giving up", why, attempt)
        logging.shutdown()
        os._exit(EXIT_STUCK)
    logger.warning(
        "%s; starting this command over (attempt %d): %s",
        why,
        attempt + 1,
        shlex.join(sys.orig_argv),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[ATTEMPT_VARIABLE] = str(attempt + 1)
    os.execv(sys.executable, sys.orig_argv)


def _is_raylet(process: psutil.Process) -> bool:
    with suppress(psutil.Error):
        return process.name() == "raylet"
    return False


def _is_running(process: psutil.Process) -> bool:
    with suppress(psutil.Error):
        return process.status() != psutil.STATUS_ZOMBIE
    return False


def _newest_own_session() -> Path | None:
    """The newest session directory a local start in this process created (Ray names it
    ``session_<date>_<time>_<pid>``)."""
    sessions = sorted(Path(get_default_ray_temp_dir()).glob(f"session_*_{os.getpid()}"))
    return sessions[-1] if sessions else None


def _session_processes(session_name: str) -> dict[psutil.Process, str]:
    """This process's live descendants started for the session (each names it on its command
    line), with their names."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and any(
                session_name in argument for argument in child.cmdline()
            ):
                found[child] = child.name()
    return found


def _raylet_alive(session_name: str) -> bool:
    return "raylet" in _session_processes(session_name).values()


def _stop_session(session_name: str) -> None:
    """Stop what is left of a session's processes (SIGTERM, then SIGKILL)."""
    processes = list(_session_processes(session_name))
    for process in processes:
        with suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=_STOP_SECONDS)
    for process in alive:
        with suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=_STOP_SECONDS)


def raylet_fatal_line(session: Path) -> str:
    """``<session>/logs/raylet.err:<line>: <message>`` for the raylet's first fatal log line, or
    where to look when it left none (a raylet killed by a signal writes nothing)."""
    log = session / "logs" / "raylet.err"
    if log.is_file():
        for number, line in enumerate(log.read_text(errors="replace").splitlines(), start=1):
            if _FATAL_LOG_LINE.match(line):
                return f"{log}:{number}: {line.strip()}"
    return f"no fatal line in {log}; the session's logs are in {session / 'logs'}"
