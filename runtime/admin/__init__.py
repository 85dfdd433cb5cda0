"""Operating a running daemon: the admin loop, its Unix socket, its client, signals.

`daemon.run_daemon(app)` is what `streams-runtime run` does after `app.start()`:
an asyncio loop (uvloop) on the main thread that turns signals, admin-socket
requests and metrics scrapes into calls on the `App`. Blocking `App` calls run
on the loop's executor threads (named `admin_N`), never on the loop itself.

- `protocol`: the newline-delimited JSON requests and replies (`COMMANDS`,
  `parse_request`, `encode_reply`; pure, any thread).
- `handler`: `AdminHandler`, the commands carried out on the `App` (any
  thread; blocks, so the server runs it on an executor thread).
- `server`: the asyncio Unix socket server and its limits (loop thread only).
- `client`: `request()` for scripts and tests, and the `streams-runtime admin`
  command's table output (any thread; one connection per call).
- `daemon`: signal handling (gunicorn's shape: handlers only enqueue), the
  admin socket and the metrics endpoint, the exit code.
- `preflight`: what `run` checks before the app starts (admin socket path,
  metrics address) and the open-files limit (main thread).
- `autoscaler`: the thread autoscaler's pure decisions (admin loop).
- `paths`: where the admin socket is when `admin.socket` is unset (the
  daemon's default, which the `admin` command finds by itself); any thread.
- `signals`: SIGTERM/SIGINT of `run` outside the admin loop (start-up, and
  after the loop): an exit with 128 + the signal's number before the app
  started anything, else recorded for the loop (main thread only).
"""
