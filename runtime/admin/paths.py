"""Where the admin socket is when `admin.socket` is not set (issue 32).

The daemon opens one by default so that `streams-runtime admin status` works
right after `streams-runtime run` with no more settings; the client finds it
the same way. The directory is the first of `socket_dirs()` that takes the
socket's path within the Unix limit (107 bytes): `$XDG_RUNTIME_DIR/streams-runtime`
(per user, cleared at logout), else `<tempdir>/streams-runtime-<uid>`, else
`/tmp/streams-runtime-<uid>` (a long `$TMPDIR` leaves no room for a name). A
directory the runtime makes is mode 0700; one it finds must be a real
directory (no symlink) of this user that no one else may enter, or it is not
used: in a shared /tmp another user could have made it first.

The socket is `<application.id>.sock`; a long application id is cut and
given a hash (`<start>~<hash>.sock`), and a second daemon of the same
application on this host takes `<name>+<pid>.sock`. Neither `~` nor `+` may
appear in an application id, so names of different applications never
match each other's pattern.

`admin.socket=""` (or `none`) turns the socket off; an explicit path is
used as it is, as before.

Pure path logic and file-system checks: any thread; the daemon calls
`choose_default_socket` on the main thread before the app starts, the
`admin` command `find_default_socket` on its main thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import stat
import tempfile
from collections.abc import Mapping

__all__ = [
    "SOCKET_OFF",
    "DefaultSocketError",
    "choose_default_socket",
    "find_default_socket",
    "socket_dirs",
    "socket_stem",
]

SOCKET_OFF = ""
"""`StreamsConfig.admin_socket` when `admin.socket` is "" or `none`: no socket."""

_UNIX_PATH_MAX = 107  # sun_path is 108 bytes, NUL included
_DIR_NAME = "streams-runtime"
_HASH_CHARS = 12
_PROBE_TIMEOUT_S = 1.0


class DefaultSocketError(RuntimeError):
    """No default socket can be used (the daemon) or found (the client); says why."""


def socket_dirs(env: Mapping[str, str] | None = None) -> list[str]:
    """The candidate directories, in order of preference (see the module docstring)."""
    env = os.environ if env is None else env
    dirs = []
    runtime_dir = env.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime_dir) and os.path.isdir(runtime_dir):
        dirs.append(os.path.join(runtime_dir, _DIR_NAME))
    user_dir = f"{_DIR_NAME}-{os.getuid()}"
    dirs.append(os.path.join(tempfile.gettempdir(), user_dir))
    fallback = os.path.join("/tmp", user_dir)
    if fallback not in dirs:
        dirs.append(fallback)
    return dirs


def socket_stem(application_id: str, directory: str) -> str | None:
    """The socket's file name without `.sock` in `directory`, leaving room for
    `+<pid>`; None if even a cut name would not fit."""
    room = _UNIX_PATH_MAX - len(os.fsencode(os.path.join(directory, ""))) - len(".sock")
    room -= len("+") + 7  # a pid of up to 7 digits (Linux's pid_max is at most 4194304)
    if len(os.fsencode(application_id)) <= room:
        return application_id
    digest = hashlib.sha256(application_id.encode()).hexdigest()[:_HASH_CHARS]
    keep = room - len("~") - len(digest)
    if keep < 1:
        return None
    return f"{application_id[:keep]}~{digest}"


def _private_dir(directory: str) -> None:
    """Make `directory` (mode 0700) or check that it is this user's private
    directory; raises DefaultSocketError saying why not."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    try:
        info = os.lstat(directory)
    except OSError as exc:
        raise DefaultSocketError(f"{directory}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise DefaultSocketError(f"{directory} is not a directory")
    if info.st_uid != os.getuid():
        raise DefaultSocketError(f"{directory} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        raise DefaultSocketError(
            f"{directory} may be entered by other users (mode {stat.S_IMODE(info.st_mode):o})"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DefaultSocketError(f"{directory} cannot be written")


def _answers(path: str) -> bool:
    """Whether a daemon listens on the socket `path` (a connect, closed at once)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(_PROBE_TIMEOUT_S)
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def choose_default_socket(
    application_id: str, env: Mapping[str, str] | None = None, pid: int | None = None
) -> str:
    """The path the daemon of `application_id` listens on when `admin.socket`
    is unset: `<dir>/<stem>.sock`, or `<dir>/<stem>+<pid>.sock` when another
    daemon of the application answers on the first. The directory is made if
    need be. A stale socket is left for the server to replace. Raises
    DefaultSocketError when no candidate directory can be used."""
    reasons = []
    for directory in socket_dirs(env):
        stem = socket_stem(application_id, directory)
        if stem is None:
            reasons.append(f"{directory}: too long a path for a Unix socket")
            continue
        try:
            _private_dir(directory)
        except DefaultSocketError as exc:
            reasons.append(str(exc))
            continue
        path = os.path.join(directory, f"{stem}.sock")
        if _answers(path):
            path = os.path.join(directory, f"{stem}+{os.getpid() if pid is None else pid}.sock")
        return path
    raise DefaultSocketError("; ".join(reasons))


def _sockets_in(directory: str, stem: str | None) -> list[str]:
    """Socket files in `directory`: of the application whose stem is `stem`
    (`<stem>.sock`, `<stem>+<pid>.sock`), or all when `stem` is None."""
    pattern = re.compile(re.escape(stem) + r"(\+[0-9]+)?\.sock" if stem else r".+\.sock")
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(directory, name)
        if not pattern.fullmatch(name):
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
    return found


def find_default_socket(application_id: str | None, env: Mapping[str, str] | None = None) -> str:
    """The socket of the one daemon that answers in the default directories:
    of `application_id` when given, else of any application. The directories
    are searched in the daemon's order of preference and the first where a
    daemon answers decides (a daemon uses a later one only when an earlier
    one cannot take its socket), so daemons of another `$TMPDIR` or
    `$XDG_RUNTIME_DIR` do not make the answer ambiguous. Raises
    DefaultSocketError naming what was looked for and what to pass instead."""
    dirs = socket_dirs(env)
    stale = 0
    for directory in dirs:
        stem = socket_stem(application_id, directory) if application_id else None
        if application_id and stem is None:
            continue
        candidates = _sockets_in(directory, stem)
        live = [path for path in candidates if _answers(path)]
        stale += len(candidates) - len(live)
        if len(live) == 1:
            return live[0]
        if len(live) > 1:
            which = f"of {application_id!r} " if application_id else ""
            more = "" if application_id else " or --application-id ID"
            raise DefaultSocketError(
                f"several daemons {which}answer in {directory}: pass --socket PATH{more} "
                f"({', '.join(live)})"
            )
    what = f"of application {application_id!r}" if application_id else "of any application"
    left = f" ({stale} left by daemons that are gone)" if stale else ""
    raise DefaultSocketError(
        f"no daemon {what} answers in {' or '.join(dirs)}{left}: is it running here, as this "
        "user? With admin.socket set, pass --socket PATH or --config app.toml"
    )
