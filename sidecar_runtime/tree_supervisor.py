"""The supervisor `proctree` starts for each run: one command, and nothing of it left behind.

Run as `python -I -S tree_supervisor.py SIDECAR_PID CHANNEL_FD PROGRAM ARGV0 [ARG ...]`, in the
command's working directory and with its stdio. It reads the command's environment from the
CHANNEL_FD socket (NUL-separated `NAME=VALUE` entries up to EOF; an environment on the command
line would be readable by every user through /proc/PID/cmdline), then:

* makes itself a child subreaper, so every descendant orphaned during the run, whether it
  called setsid() or forked twice, is re-parented to this process and stays within reach;
* asks for SIGTERM when its parent dies, and compares getppid() with SIDECAR_PID, so a sidecar
  that dies (even by SIGKILL) ends the run;
* forks the command: default SIGPIPE/SIGXFSZ (Python ignores them), an empty signal mask,
  SIGKILL when this supervisor dies, and execve() of the absolute PROGRAM; it answers on the
  channel `ok` or `err ERRNO` (exec's own errno), then closes the channel;
* closes its own copies of the stdio pipes, so the reader sees EOF once the tree is gone;
* when the command exits, or on SIGTERM/SIGHUP/SIGINT, or when the sidecar is gone, kills every
  descendant with SIGKILL (found by walking /proc), reaps, and repeats until it has no child
  left or the time bound runs out;
* exits as the command did: its exit code, or the same signal raised again on itself.

Stdlib only, and only modules that load fast: `_signal` rather than `signal`, `os.read` rather
than `socket`. Nothing here may raise past `main`: an exception is
turned into killing the tree and exit status 125.
"""

import ctypes
import os
import sys
import time

# `signal` wraps `_signal` in enums, whose import costs more than the rest of this script; the
# type checker reads `signal`'s stubs for both (it takes TYPE_CHECKING as true by its name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
else:
    import _signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

SIGCHLD = _signal.SIGCHLD
SIGKILL = _signal.SIGKILL
STOP_SIGNALS = (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGINT)
WAITED = {SIGCHLD, *STOP_SIGNALS}
# Ignored by Python at start-up; an ignored disposition survives exec, so the command gets them back.
RESET_FOR_COMMAND = (_signal.SIGPIPE, _signal.SIGXFSZ)

PARENT_CHECK_SECONDS = 0.5  # backstop for the parent-death signal; it normally arrives at once
KILL_BOUND_SECONDS = 5.0  # a tree that forks faster than it can be killed is abandoned after this
EXIT_SUPERVISOR_FAILED = 125
EXIT_EXEC_FAILED = 127


def _prctl(libc: ctypes.CDLL, option: int, value: int) -> None:
    if libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _environment(blob: bytes) -> dict[bytes, bytes]:
    env = {}
    for entry in blob.split(b"\0"):
        if entry:
            name, _, value = entry.partition(b"=")
            env[name] = value
    return env


def _descendants(root: int) -> list[int]:
    """Every live process whose parent chain leads to `root`, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:  # gone between the listing and the read
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found = []
    pending = list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


class Supervisor:
    def __init__(self) -> None:
        self.me = os.getpid()
        self.command = 0
        self.status: int | None = None  # the command's wait status, once reaped

    def reap(self) -> bool:
        """Reap every child that has exited; False once no child is left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.command:
                self.status = status

    def kill_tree(self) -> None:
        deadline = time.monotonic() + KILL_BOUND_SECONDS
        while True:
            for pid in _descendants(self.me):
                try:  # noqa: SIM105 (contextlib would be one more import to load per run)
                    os.kill(pid, SIGKILL)
                except OSError:  # already gone, or not ours to kill
                    pass
            if not self.reap() or time.monotonic() > deadline:
                return
            # A killed process's children are re-parented here; their SIGCHLD ends the wait.
            _signal.sigtimedwait({SIGCHLD}, 0.01)

    def wait(self, sidecar: int) -> None:
        """Until the command has exited, a stop signal arrived, or the sidecar is gone."""
        while self.status is None:
            info = _signal.sigtimedwait(WAITED, PARENT_CHECK_SECONDS)
            if info is None:
                if os.getppid() != sidecar:
                    return
            elif info.si_signo == SIGCHLD:
                self.reap()
            else:
                return


def _start(libc: ctypes.CDLL, program: str, argv: list[str], env: dict[bytes, bytes]) -> tuple[int, int]:
    """Fork and exec the command; its pid and exec's errno (0: it runs)."""
    errors_r, errors_w = os.pipe()  # close-on-exec: EOF without data means exec succeeded
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(errors_r)
            _prctl(libc, PR_SET_PDEATHSIG, SIGKILL)
            if os.getppid() != supervisor:
                os._exit(EXIT_EXEC_FAILED)
            for signum in RESET_FOR_COMMAND:
                _signal.signal(signum, _signal.SIG_DFL)
            _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
            os.execve(program, argv, env)
        except OSError as error:
            os.write(errors_w, str(error.errno or 0).encode())
        finally:
            os._exit(EXIT_EXEC_FAILED)
    os.close(errors_w)
    reported = _read_all(errors_r)
    os.close(errors_r)
    return pid, int(reported) if reported else 0


def _exit_like(status: int | None) -> None:
    if status is None:
        os._exit(EXIT_SUPERVISOR_FAILED)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    signum = os.WTERMSIG(status)
    # Raised again on itself, so the sidecar sees the same negative returncode; no core file.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0)
    if signum != SIGKILL:  # SIGKILL's disposition cannot be changed, nor needs to be
        _signal.signal(signum, _signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {signum})
    os._exit(128 + signum)


def main(args: list[str]) -> None:
    _signal.pthread_sigmask(_signal.SIG_BLOCK, WAITED)
    sidecar, channel, program, argv = int(args[0]), int(args[1]), args[2], args[3:]
    supervisor = Supervisor()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _prctl(libc, PR_SET_CHILD_SUBREAPER, 1)
        _prctl(libc, PR_SET_PDEATHSIG, _signal.SIGTERM)
        if os.getppid() != sidecar:  # it died before the parent-death signal was armed
            os._exit(EXIT_SUPERVISOR_FAILED)
        os.set_inheritable(channel, False)  # the command must not hold the channel open
        env = _environment(_read_all(channel))
        supervisor.command, errno = _start(libc, program, argv, env)
        os.write(channel, f"err {errno}".encode() if errno else b"ok")
        os.close(channel)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        supervisor.wait(sidecar)
    except BaseException:
        supervisor.kill_tree()
        os._exit(EXIT_SUPERVISOR_FAILED)
    supervisor.kill_tree()
    _exit_like(supervisor.status)


if __name__ == "__main__":
    main(sys.argv[1:])
