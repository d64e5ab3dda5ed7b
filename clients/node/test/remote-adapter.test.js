// A remote adapter written in Node (examples/remote-adapter.js), brokered by the real
// negotiator: registered at run time, invoked, and calling a tool that lives in a Node caller.

import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { WORD_INTERVAL_MS, startNodeAdapter } from '../examples/remote-adapter.js';
import { connect, decodeStatus, grpc } from '../src/index.js';
import { startSidecar } from '../test-support/sidecars.js';

const KEY_SCHEMA = JSON.stringify({
  type: 'object',
  properties: { key: { type: 'string' } },
  required: ['key'],
});

let sidecar;
let adapter;
let workDir;
let client;
const cancelledPrompts = [];
let cancelled = () => {}; // resolves the waiter of the next cancel

before(async () => {
  sidecar = await startSidecar('negotiator');
  workDir = await mkdtemp(path.join(os.tmpdir(), 'agentsidecar-node-adapter-'));
  adapter = await startNodeAdapter({
    listen: `unix:${path.join(workDir, 'adapter.sock')}`,
    onCancelled: (prompt) => {
      cancelledPrompts.push(prompt);
      cancelled();
    },
  });
  client = connect(sidecar.uds, { service: 'negotiator' });
  await client.waitForReady(10_000);
  const { adapter: registered } = await client.registerAdapter({ target: adapter.address, shortname: 'node-echo' });
  assert.equal(registered.implementation, 'remote');
});

after(async () => {
  client?.close();
  await adapter?.stop();
  if (workDir !== undefined) await rm(workDir, { recursive: true, force: true });
  if (sidecar === undefined) return;
  const { code } = await sidecar.stop();
  assert.equal(code, 0, `negotiator exited with ${code}; stderr:\n${sidecar.stderr()}`);
});

test('the negotiator fetched the Node adapter declaration', async () => {
  const { adapter: found } = await client.getAdapter({ shortname: 'node-echo' });
  const supported = found.declaration.capabilities
    .filter(({ state }) => state === 'CAPABILITY_STATE_SUPPORTED')
    .map(({ capability }) => capability)
    .sort();
  assert.deepEqual(supported, [
    'CAPABILITY_STREAM_EVENTS',
    'CAPABILITY_STRUCTURED_OUTPUT',
    'CAPABILITY_TOOL_REGISTRATION',
  ]);
});

test('Invoke and Produce are brokered to the Node adapter', async () => {
  const invoked = await client.invoke({ adapter: 'node-echo', prompt: 'hello from node' });
  assert.equal(invoked.text, 'node:hello from node');
  const produced = await client.produce({
    adapter: 'node-echo',
    prompt: 'p',
    outputSchema: JSON.stringify({ type: 'object', required: ['echo'] }),
  });
  assert.deepEqual(JSON.parse(produced.outputJson), { echo: 'p' });
});

test('what the Node adapter left undeclared is refused before it runs', async () => {
  const error = await client.invoke({ adapter: 'node-echo', prompt: 'x', options: { persona: 'pirate' } }).then(
    () => assert.fail('the call was accepted'),
    (failure) => failure,
  );
  const status = decodeStatus(error);
  assert.equal(status.code, grpc.status.FAILED_PRECONDITION);
  assert.equal(status.errorInfo.reason, 'UNSUPPORTED_CAPABILITY');
  assert.equal(status.errorInfo.metadata.adapter, 'node-echo');
  // Undeclared is unknown, and an unknown capability is refused unless the caller allows it.
  assert.deepEqual(
    status.preconditionFailure.violations.map(({ subject, description }) => [subject, description.includes('unknown')]),
    [['persona', true]],
  );
});

test("the Node adapter's model calls a tool that lives in the Node caller", async () => {
  const session = client.raw.toolSession();
  const messages = [];
  const ended = new Promise((resolve, reject) => {
    session.on('data', (message) => {
      messages.push(message);
      if (message.message === 'toolCall') {
        session.write({ toolResult: { callId: message.toolCall.callId, resultJson: JSON.stringify({ v: 42 }) } });
      } else if (message.message === 'invokeResult') {
        session.end();
      }
    });
    session.on('error', reject);
    session.on('end', resolve);
  });
  session.write({
    start: {
      invoke: { adapter: 'node-echo', prompt: 'tool:lookup:{"key": "answer"}' },
      tools: [{ name: 'lookup', risk: 'TOOL_RISK_READ_ONLY', argumentsSchema: KEY_SCHEMA }],
    },
  });
  await ended;
  assert.deepEqual(
    messages.map(({ message }) => message),
    ['toolCall', 'invokeResult'],
  );
  assert.deepEqual(JSON.parse(messages[0].toolCall.argumentsJson), { key: 'answer' });
  const text = messages[1].invokeResult.text;
  assert.deepEqual(JSON.parse(text.slice('node:'.length)), { tool: 'lookup', result: { v: 42 } });
});

test("the Node adapter's InvokeStream reaches the caller word by word", async () => {
  const arrivals = [];
  const request = { invoke: { adapter: 'node-echo', prompt: 'one two three', options: { streamEvents: true } } };
  for await (const message of client.invokeStream(request)) arrivals.push([performance.now(), message]);
  const messages = arrivals.map(([, message]) => message);
  assert.deepEqual(
    messages.map(({ kind }) => kind),
    ['decision', 'event', 'delta', 'delta', 'delta', 'final'],
  );
  assert.equal(messages[1].event.type, 'started');
  assert.deepEqual(
    messages.filter(({ kind }) => kind === 'delta').map(({ delta }) => delta),
    ['node:one ', 'two ', 'three'],
  );
  assert.equal(messages.at(-1).final.text, 'node:one two three');
  // Each word as the adapter sends it, not all at the end.
  const deltaTimes = arrivals.filter(([, { kind }]) => kind === 'delta').map(([time]) => time);
  assert.ok(deltaTimes[2] - deltaTimes[0] > WORD_INTERVAL_MS, `deltas at ${deltaTimes}`);
});

test("the Node adapter's ProduceStream ends with the validated output", async () => {
  const messages = [];
  const request = { produce: { adapter: 'node-echo', prompt: 'p', outputSchema: JSON.stringify({ type: 'object', required: ['echo'] }) } };
  for await (const message of client.produceStream(request)) messages.push(message);
  assert.deepEqual(
    messages.map(({ kind }) => kind),
    ['decision', 'final'],
  );
  assert.deepEqual(JSON.parse(messages[1].final.outputJson), { echo: 'p' });
});

test('a caller that leaves the stream cancels the Node adapter at once', async () => {
  const observed = new Promise((resolve) => {
    cancelled = resolve;
  });
  const prompt = Array.from({ length: 100 }, (_, n) => `w${n}`).join(' ');
  for await (const message of client.invokeStream({ invoke: { adapter: 'node-echo', prompt } })) {
    if (message.kind === 'delta') break;
  }
  const left = performance.now();
  await observed;
  assert.ok(performance.now() - left < 500, 'the cancel took over 500 ms to reach the adapter');
  assert.deepEqual(cancelledPrompts, [prompt]);
});
