"""Run the sidecar pair (seedstore + negotiator) with the embedded defaults.

Each service runs in its own process, as it would in a pod; the negotiator
asks this seedstore for capability bootstrap (`--seedstore`). This launcher
waits until both report READY, prints where they listen, forwards SIGTERM /
SIGINT to both and exits when both have drained.

Everything the quick start writes stays in the run directory unless told
otherwise: the seed store is `$SKILLSPEC_HOME` when that is set, else
`<run dir>/skillspec-home` (so a demo never writes into a user's real
`~/.skillspec`), and the negotiator's state (conversations) is
`<run dir>/state` unless `--state-dir` says where.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


def _wait_ready(name: str, process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("READY "):
            return line.strip()
    raise SystemExit(f"{name} exited before it was ready (exit code {process.wait()})")


def build_parser() -> argparse.ArgumentParser:
    from agentsidecar.sidecar_runtime.cli_common import add_version_argument

    parser = argparse.ArgumentParser(
        prog="agentsidecar-pair",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 both services drained and stopped; 1 a service exited before it was ready; "
        "2 usage error; otherwise the higher of the two services' exit codes.",
    )
    add_version_argument(parser)
    parser.add_argument("--run-dir", default="run", help="directory for the Unix sockets (default ./run)")
    parser.add_argument(
        "--seedstore-tcp", default="127.0.0.1:50061", help="seedstore TCP listener ('' for none)"
    )
    parser.add_argument(
        "--negotiator-tcp", default="127.0.0.1:50062", help="negotiator TCP listener ('' for none)"
    )
    parser.add_argument(
        "--negotiator-config", default=None, help="negotiator YAML config (default: embedded)"
    )
    parser.add_argument(
        "--state-dir", default=None, help="the negotiator's state directory (default <run dir>/state)"
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry spans from both services, exported as the OTEL_* variables say",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    run_dir = Path(args.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = os.environ.copy()
    store_home = env.get("SKILLSPEC_HOME") or str(run_dir / "skillspec-home")
    env["SKILLSPEC_HOME"] = store_home
    state_dir = args.state_dir or str(run_dir / "state")
    bin_dir = Path(sys.executable).parent
    seedstore_socket = f"unix:{run_dir / 'seedstore.sock'}"
    seedstore_cmd = [str(bin_dir / "seedstore"), "serve", "--listen", seedstore_socket]
    if args.seedstore_tcp:
        seedstore_cmd += ["--listen", args.seedstore_tcp]
    negotiator_cmd = [str(bin_dir / "negotiator"), "serve", "--listen", f"unix:{run_dir / 'negotiator.sock'}"]
    if args.negotiator_tcp:
        negotiator_cmd += ["--listen", args.negotiator_tcp]
    if args.negotiator_config:
        negotiator_cmd += ["--config", args.negotiator_config]
    negotiator_cmd += ["--seedstore", seedstore_socket, "--state-dir", state_dir]
    if args.otel:
        seedstore_cmd.append("--otel")
        negotiator_cmd.append("--otel")

    processes: list[subprocess.Popen[str]] = []

    def forward(signum: int, _frame: object) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for name, command in (("seedstore", seedstore_cmd), ("negotiator", negotiator_cmd)):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        processes.append(process)
        print(_wait_ready(name, process), flush=True)
        # Keep draining stdout so a chatty child never blocks on a full pipe.
        threading.Thread(target=lambda p=process: [None for _ in p.stdout or ()], daemon=True).start()
    where = (
        "from SKILLSPEC_HOME"
        if os.environ.get("SKILLSPEC_HOME")
        else "project-local; set SKILLSPEC_HOME for another"
    )
    print(
        f"pair ready (seed store {store_home}/capabilities, {where}): try "
        "`.venv/bin/seedstore --server unix:run/seedstore.sock list` or "
        "`.venv/bin/negotiator --server unix:run/negotiator.sock adapters`; Ctrl-C stops both",
        flush=True,
    )
    codes = [process.wait() for process in processes]
    return max(codes, default=0)


if __name__ == "__main__":
    raise SystemExit(main())
