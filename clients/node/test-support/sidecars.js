// Starts the real Python sidecars as subprocesses for the tests.

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const packageDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_DIR = path.resolve(packageDir, '../..');

const READY_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 15_000;

/** env PYTHON, else the repository's .venv, else python3 on PATH. */
export function pythonExecutable() {
  if (process.env.PYTHON) return process.env.PYTHON;
  const venvPython = path.join(REPO_DIR, '.venv', 'bin', 'python');
  return existsSync(venvPython) ? venvPython : 'python3';
}

/** `unix:/abs` (what READY prints) as `unix:///abs`; TCP targets unchanged. */
export function dialTarget(bound) {
  if (bound.startsWith('unix:') && !bound.startsWith('unix://')) {
    const socketPath = bound.slice('unix:'.length);
    if (!path.isAbsolute(socketPath)) throw new Error(`relative socket path in READY line: ${bound}`);
    return `unix://${socketPath}`;
  }
  return bound;
}

/**
 * Run `<python> -m <name>_service.cli serve --listen unix:<tmp>/<name>.sock
 * --listen 127.0.0.1:0` and wait for its READY line. Resolves to
 * {name, uds, tcp, socketPath, home, stop()}, where uds and tcp are dial targets.
 */
export async function startSidecar(name, extraArgs = []) {
  const workDir = await mkdtemp(path.join(os.tmpdir(), `agentsidecar-node-${name}-`));
  const home = path.join(workDir, 'home');
  const socketPath = path.join(workDir, `${name}.sock`);
  const args = [
    '-m',
    `${name}_service.cli`,
    'serve',
    '--listen',
    `unix:${socketPath}`,
    '--listen',
    '127.0.0.1:0',
    ...extraArgs,
  ];
  const child = spawn(pythonExecutable(), args, {
    cwd: REPO_DIR,
    // A state directory of its own: the negotiator keeps runtime registrations there across restarts.
    env: { ...process.env, SKILLSPEC_HOME: home, XDG_STATE_HOME: path.join(workDir, 'state'), PYTHONUNBUFFERED: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  // Drain both pipes for the whole run: a full stderr pipe would block the sidecar.
  child.stderr.setEncoding('utf8').on('data', (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));

  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${name} printed no READY line in ${READY_TIMEOUT_MS} ms; stderr:\n${stderr}`)),
      READY_TIMEOUT_MS,
    );
    child.stdout.setEncoding('utf8').on('data', (chunk) => {
      stdout += chunk;
      const line = stdout.split('\n').find((candidate) => candidate.startsWith(`READY ${name} `));
      if (line !== undefined) {
        clearTimeout(timer);
        resolve(line.trim().split(/\s+/).slice(2));
      }
    });
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${pythonExecutable()}: ${error.message}`));
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (code ${code}, signal ${signal}) before READY; stderr:\n${stderr}`));
    });
  });

  let bound;
  try {
    bound = await ready;
  } catch (error) {
    child.kill('SIGKILL');
    await rm(workDir, { recursive: true, force: true });
    throw error;
  }
  const uds = bound.find((target) => target.startsWith('unix:'));
  const tcp = bound.find((target) => !target.startsWith('unix:'));
  if (uds === undefined || tcp === undefined) {
    child.kill('SIGKILL');
    throw new Error(`READY line lacks a unix and a TCP target: ${bound.join(' ')}`);
  }

  return {
    name,
    home,
    socketPath,
    uds: dialTarget(uds),
    tcp: dialTarget(tcp),
    stderr: () => stderr,
    /** SIGTERM, wait for a graceful exit; resolves to {code, signal, socketLeft}. */
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      let timer;
      const outcome = await Promise.race([
        exited,
        new Promise((resolve) => {
          timer = setTimeout(() => resolve(null), STOP_TIMEOUT_MS);
        }),
      ]);
      clearTimeout(timer);
      if (outcome === null) {
        child.kill('SIGKILL');
        await exited;
        throw new Error(`${name} did not stop within ${STOP_TIMEOUT_MS} ms of SIGTERM; stderr:\n${stderr}`);
      }
      const socketLeft = existsSync(socketPath);
      await rm(workDir, { recursive: true, force: true });
      return { ...outcome, socketLeft };
    },
  };
}
