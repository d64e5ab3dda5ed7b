// listAllSeeds / listAllAdapters / walkPages: every page of a real seedstore and a real
// negotiator (enough seeds and adapters for several pages), and a grpc-js server that
// sends a page token back again, which must end the walk with an error, not a loop.

import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { connect, grpc, loadProtos, PageTokenRepeatedError, walkPages } from '../src/index.js';
import { startSidecar } from '../test-support/sidecars.js';

const SEEDS = ['echo', 'say', 'speak', 'talk', 'tell', 'voice', 'whisper'];
const ADAPTERS = ['a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'a7'];

const collect = async (iterable) => {
  const items = [];
  for await (const item of iterable) items.push(item);
  return items;
};

let seedstore;
let negotiator;
let configDir;

before(async () => {
  configDir = await mkdtemp(path.join(os.tmpdir(), 'agentsidecar-node-paging-'));
  const config = path.join(configDir, 'negotiator.yaml');
  await writeFile(
    config,
    'adapters:\n' +
      ADAPTERS.map(
        (name) =>
          `  - {shortname: ${name}, implementation: scripted, declaration: {kind: agent-framework}, ` +
          'options: {invoke: {text: hi}}}\n',
      ).join(''),
  );
  [seedstore, negotiator] = await Promise.all([
    startSidecar('seedstore'),
    startSidecar('negotiator', ['--config', config]),
  ]);
});

after(async () => {
  for (const sidecar of [seedstore, negotiator]) {
    if (sidecar === undefined) continue; // `before` failed and said why
    const { code } = await sidecar.stop();
    assert.equal(code, 0, `${sidecar.name} exited with ${code} on SIGTERM; stderr:\n${sidecar.stderr()}`);
  }
  await rm(configDir, { recursive: true, force: true });
});

describe('a real seedstore, in pages', () => {
  const domain = 'paging';
  let client;

  before(async () => {
    client = connect(seedstore.tcp, { service: 'seedstore' });
    await client.waitForReady(10_000);
    // In an order other than the listing's, which sorts by domain then id.
    for (const id of [...SEEDS].reverse()) {
      await client.addSeed({ id, domain, kind: 'cli', command: 'true', provides: ['text-to-speech'] });
    }
    // A file no seed can be read from: a problem, listed after the last seed.
    const domainDir = path.join(seedstore.home, 'capabilities', domain);
    await mkdir(domainDir, { recursive: true });
    await writeFile(path.join(domainDir, 'zz-broken.yml'), 'id: [unclosed\n');
    // Another program's edit: the seedstore sees it at its next refresh.
    for (let tries = 0; (await client.listSeeds({ domain })).problems.length === 0; tries += 1) {
      assert.ok(tries < 100, 'the seedstore never listed the broken file');
      await sleep(100);
    }
  });

  after(() => client.close());

  test('walkPages yields every page, each at most pageSize long, the last with an empty token', async () => {
    const pages = await collect(walkPages(client.listSeeds, { domain, pageSize: 2 }));
    assert.deepEqual(
      pages.map((page) => page.seeds.length),
      [2, 2, 2, 1],
    );
    assert.ok(pages.slice(0, -1).every((page) => page.nextPageToken !== ''));
    assert.equal(pages.at(-1).nextPageToken, '');
  });

  test('listAllSeeds merges the pages into the one reply a single page would be', async () => {
    const whole = await client.listSeeds({ domain });
    assert.equal(whole.nextPageToken, '', 'the default page size holds every seed');
    const merged = await client.listAllSeeds({ domain, pageSize: 2 });
    assert.deepEqual(
      merged.seeds.map((seed) => seed.id),
      SEEDS,
    );
    assert.equal(merged.problems.length, 1);
    assert.match(merged.problems[0].path, /zz-broken\.yml$/);
    assert.deepEqual(merged, whole);
    assert.equal(merged.seedStore, `${seedstore.home}/capabilities`);
    assert.equal(merged.domain, domain);
  });

  test('listAllSeeds does not modify the request it was given', async () => {
    const request = { domain, pageSize: 3 };
    const merged = await client.listAllSeeds(request);
    assert.equal(merged.seeds.length, SEEDS.length);
    assert.deepEqual(request, { domain, pageSize: 3 });
  });

  test('a page the server refuses rejects the walk with its ServiceError', async () => {
    await assert.rejects(client.listAllSeeds({ domain, pageToken: 'not-a-token' }), (error) => {
      assert.equal(error.code, grpc.status.INVALID_ARGUMENT);
      return true;
    });
  });
});

describe('a real negotiator, in pages', () => {
  let client;

  before(async () => {
    client = connect(negotiator.uds, { service: 'negotiator' });
    await client.waitForReady(10_000);
  });

  after(() => client.close());

  test('walkPages yields pages of pageSize adapters, sorted by shortname across pages', async () => {
    const pages = await collect(walkPages(client.listAdapters, { pageSize: 3 }));
    assert.deepEqual(
      pages.map((page) => page.adapters.map((adapter) => adapter.declaration.shortname)),
      [
        ['a1', 'a2', 'a3'],
        ['a4', 'a5', 'a6'],
        ['a7'],
      ],
    );
  });

  test('listAllAdapters returns every adapter, as one page of the default size does', async () => {
    const whole = await client.listAdapters({});
    assert.equal(whole.nextPageToken, '');
    const all = await client.listAllAdapters({ pageSize: 2 });
    assert.deepEqual(
      all.adapters.map((adapter) => adapter.declaration.shortname),
      ADAPTERS,
    );
    assert.deepEqual(all, whole);
  });
});

// A SeedStoreService and a NegotiatorService whose ListSeeds / ListAdapters answer with the
// page tokens of `tokens` in turn (the last one for ever), each after `delayMs`, recording
// each request's page token.
async function startRepeatingServer(tokens, delayMs = 0) {
  const protos = loadProtos();
  const received = [];
  const answer = (field) => (call, callback) => {
    received.push(call.request.pageToken);
    const nextPageToken = tokens[Math.min(received.length - 1, tokens.length - 1)];
    setTimeout(() => callback(null, { [field]: [], nextPageToken }), delayMs);
  };
  const server = new grpc.Server();
  server.addService(protos.agentsidecar.seedstore.v1.SeedStoreService.service, {
    listSeeds: answer('seeds'),
  });
  server.addService(protos.agentsidecar.negotiator.v1.NegotiatorService.service, {
    listAdapters: answer('adapters'),
  });
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, bound) =>
      error ? reject(error) : resolve(bound),
    ),
  );
  return { target: `127.0.0.1:${port}`, received, stop: () => server.forceShutdown() };
}

// Without the guard these walks would never end: a bound turns that into a failure.
const GUARDED = { timeout: 10_000 };

describe('a server that sends a page token again', () => {
  test('listAllSeeds stops with PageTokenRepeatedError when the token repeats at once', GUARDED, async () => {
    const server = await startRepeatingServer(['again']);
    const client = connect(server.target, { service: 'seedstore' });
    try {
      await assert.rejects(client.listAllSeeds({ pageSize: 5 }), (error) => {
        assert.ok(error instanceof PageTokenRepeatedError, String(error));
        assert.equal(error.method, 'ListSeeds');
        assert.equal(error.token, 'again');
        assert.equal(error.pages, 2);
        return true;
      });
      // The first page, then the page of 'again' that sent 'again' back: no third call.
      assert.deepEqual(server.received, ['', 'again']);
    } finally {
      client.close();
      server.stop();
    }
  });

  test('listAllAdapters stops when the tokens go round in a cycle', GUARDED, async () => {
    const server = await startRepeatingServer(['t1', 't2', 't1']);
    const client = connect(server.target, { service: 'negotiator' });
    try {
      await assert.rejects(client.listAllAdapters({}), (error) => {
        assert.ok(error instanceof PageTokenRepeatedError, String(error));
        assert.equal(error.method, 'ListAdapters');
        assert.equal(error.token, 't1');
        assert.equal(error.pages, 3);
        return true;
      });
      assert.deepEqual(server.received, ['', 't1', 't2']);
    } finally {
      client.close();
      server.stop();
    }
  });

  test('a token equal to the one the walk started from is a repeat too', GUARDED, async () => {
    const server = await startRepeatingServer(['start']);
    const client = connect(server.target, { service: 'seedstore' });
    try {
      await assert.rejects(
        collect(walkPages(client.listSeeds, { pageToken: 'start' }, {}, 'ListSeeds')),
        PageTokenRepeatedError,
      );
      assert.deepEqual(server.received, ['start']);
    } finally {
      client.close();
      server.stop();
    }
  });

  test('an empty token ends the walk even after distinct tokens', GUARDED, async () => {
    const server = await startRepeatingServer(['p2', 'p3', '']);
    const client = connect(server.target, { service: 'seedstore' });
    try {
      const merged = await client.listAllSeeds({});
      assert.deepEqual(merged.seeds, []);
      assert.equal(merged.nextPageToken, '');
      assert.deepEqual(server.received, ['', 'p2', 'p3']);
    } finally {
      client.close();
      server.stop();
    }
  });

  test('opts.timeoutMs is the deadline of each page, not of the whole walk', GUARDED, async () => {
    // Three pages of 400 ms each: 1.2 s in all, each well within its 1 s deadline.
    const server = await startRepeatingServer(['p2', 'p3', ''], 400);
    const client = connect(server.target, { service: 'negotiator' });
    try {
      const all = await client.listAllAdapters({}, { timeoutMs: 1_000 });
      assert.deepEqual(all.adapters, []);
      assert.deepEqual(server.received, ['', 'p2', 'p3']);
      await assert.rejects(client.listAllAdapters({}, { timeoutMs: 200 }), (error) => {
        assert.equal(error.code, grpc.status.DEADLINE_EXCEEDED);
        return true;
      });
    } finally {
      client.close();
      server.stop();
    }
  });
});
