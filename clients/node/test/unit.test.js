// The client's pure parts: targets, request helpers, status decoding (no sidecar needed).

import assert from 'node:assert/strict';
import path from 'node:path';
import { describe, test } from 'node:test';

import protobuf from 'protobufjs';

import {
  checkTarget,
  connect,
  decodeStatus,
  grpc,
  loadProtos,
  toDuration,
  toStruct,
  VENDORED_PROTOS_DIR,
} from '../src/index.js';
import { dialTarget } from '../test-support/sidecars.js';

describe('checkTarget', () => {
  for (const target of [
    'unix:///tmp/s.sock',
    'unix:/tmp/s.sock',
    'unix:run/s.sock',
    '127.0.0.1:50061',
    'localhost:1',
    '[::1]:8080',
  ]) {
    test(`accepts ${target}`, () => assert.equal(checkTarget(target), target));
  }
  for (const target of ['', 'unix:', 'unix://relative', '127.0.0.1', 'host:99999', 'host:port', 42]) {
    test(`rejects ${JSON.stringify(target)}`, () => assert.throws(() => checkTarget(target), TypeError));
  }
});

test('dialTarget turns a READY unix:/abs target into unix:///abs', () => {
  assert.equal(dialTarget('unix:/tmp/x/s.sock'), 'unix:///tmp/x/s.sock');
  assert.equal(dialTarget('127.0.0.1:4000'), '127.0.0.1:4000');
  assert.throws(() => dialTarget('unix:run/s.sock'), /relative/);
});

test('connect rejects an unknown service name', () => {
  assert.throws(() => connect('127.0.0.1:1', { service: 'seedstor' }), /seedstore" or "negotiator/);
});

test('connect exposes every RPC of both services in lowerCamelCase', () => {
  const seedstore = connect('127.0.0.1:1', { service: 'seedstore' });
  const negotiator = connect('127.0.0.1:1', { service: 'negotiator' });
  try {
    for (const name of [
      'getStore',
      'addSeed',
      'updateSeed',
      'listSeeds',
      'searchSeeds',
      'inspectSeed',
      'verifySeeds',
      'preferSeed',
      'removeSeed',
      'scanSeeds',
      'watchSeeds',
    ]) {
      assert.equal(typeof seedstore[name], 'function', name);
    }
    for (const name of [
      'listAdapters',
      'getAdapter',
      'watchAdapters',
      'registerAdapter',
      'deregisterAdapter',
      'negotiate',
      'produce',
      'invoke',
    ]) {
      assert.equal(typeof negotiator[name], 'function', name);
    }
    assert.equal(seedstore.service, 'agentsidecar.seedstore.v1.SeedStoreService');
  } finally {
    seedstore.close();
    negotiator.close();
  }
});

test('a unary call to a dead target rejects with UNAVAILABLE within its deadline', async () => {
  const client = connect('unix:///nonexistent/agentsidecar.sock', { service: 'seedstore' });
  try {
    await assert.rejects(client.getStore({}, { timeoutMs: 2_000 }), (error) => {
      assert.ok(
        [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED].includes(error.code),
        String(error.code),
      );
      assert.equal(decodeStatus(error).errorInfo, null);
      return true;
    });
  } finally {
    client.close();
  }
});

test('a stream that fails before it is iterated throws from the loop instead of crashing', async () => {
  const client = connect('unix:///nonexistent/agentsidecar.sock', { service: 'seedstore' });
  try {
    const events = client.verifySeeds({ ids: ['x'] }, { timeoutMs: 1_000 });
    await assert.rejects(events.waitForHeaders(), /stream ended before headers/);
    await assert.rejects(
      (async () => {
        for await (const event of events) assert.fail(`unexpected event ${JSON.stringify(event)}`);
      })(),
      (error) => [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED].includes(error.code),
    );
  } finally {
    client.close();
  }
});

test('toStruct builds google.protobuf.Struct values that survive a round trip', () => {
  const struct = toStruct({
    temperature: 0.5,
    name: 'x',
    on: true,
    none: null,
    list: [1, 'a'],
    nested: { k: 2 },
  });
  assert.deepEqual(struct.fields.temperature, { numberValue: 0.5 });
  assert.deepEqual(struct.fields.none, { nullValue: 'NULL_VALUE' });
  assert.deepEqual(struct.fields.list, { listValue: { values: [{ numberValue: 1 }, { stringValue: 'a' }] } });
  assert.deepEqual(struct.fields.nested, { structValue: { fields: { k: { numberValue: 2 } } } });
  assert.throws(() => toStruct({ bad: () => 1 }), TypeError);
});

test('toDuration splits seconds and nanos', () => {
  assert.deepEqual(toDuration(2.5), { seconds: '2', nanos: 500_000_000 });
  assert.deepEqual(toDuration(10), { seconds: '10', nanos: 0 });
});

test('the loaded protos include both services, health and the vendored google.rpc types', () => {
  const protos = loadProtos();
  assert.ok(protos.agentsidecar.seedstore.v1.SeedStoreService.service.VerifySeeds.responseStream);
  assert.ok(protos.agentsidecar.negotiator.v1.NegotiatorService.service.Produce);
  assert.ok(protos.grpc.health.v1.Health.service.Check);
});

describe('decodeStatus', () => {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) =>
    target.startsWith('google/protobuf/') ? target : path.join(VENDORED_PROTOS_DIR, target);
  root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
  const Status = root.lookupType('google.rpc.Status');
  const pack = (typeName, value) => {
    const type = root.lookupType(typeName);
    return { type_url: `type.example/${typeName}`, value: type.encode(type.fromObject(value)).finish() };
  };
  const errorWith = (code, details, statusMessage) => {
    const metadata = new grpc.Metadata();
    const status = Status.fromObject({ code, message: statusMessage, details });
    metadata.set('grpc-status-details-bin', Buffer.from(Status.encode(status).finish()));
    return Object.assign(new Error('call failed'), { code, details: 'from grpc-message', metadata });
  };

  test('unpacks ErrorInfo, BadRequest, PreconditionFailure and RetryInfo', () => {
    const decoded = decodeStatus(
      errorWith(
        grpc.status.FAILED_PRECONDITION,
        [
          pack('google.rpc.ErrorInfo', { reason: 'R', domain: 'd.example', metadata: { a: '1' } }),
          pack('google.rpc.BadRequest', { fieldViolations: [{ field: 'f', description: 'bad f' }] }),
          pack('google.rpc.PreconditionFailure', {
            violations: [
              { type: 'T1', subject: 's1', description: 'd1' },
              { type: 'T2', subject: 's2', description: 'd2' },
            ],
          }),
          pack('google.rpc.RetryInfo', { retryDelay: { seconds: 1, nanos: 500_000_000 } }),
        ],
        'the status message',
      ),
    );
    assert.equal(decoded.code, grpc.status.FAILED_PRECONDITION);
    assert.equal(decoded.codeName, 'FAILED_PRECONDITION');
    assert.equal(decoded.message, 'the status message');
    assert.deepEqual(decoded.errorInfo, { reason: 'R', domain: 'd.example', metadata: { a: '1' } });
    assert.deepEqual(decoded.badRequest, { fieldViolations: [{ field: 'f', description: 'bad f' }] });
    assert.deepEqual(decoded.preconditionFailure.violations, [
      { type: 'T1', subject: 's1', description: 'd1' },
      { type: 'T2', subject: 's2', description: 'd2' },
    ]);
    assert.equal(decoded.retryDelaySeconds, 1.5);
    assert.deepEqual(decoded.otherDetails, []);
  });

  test('keeps details of types it does not know', () => {
    const decoded = decodeStatus(
      errorWith(
        grpc.status.INTERNAL,
        [{ type_url: 'type.example/acme.Unknown', value: Buffer.from([8, 1]) }],
        'x',
      ),
    );
    assert.equal(decoded.errorInfo, null);
    assert.deepEqual(decoded.otherDetails, [
      { typeUrl: 'type.example/acme.Unknown', value: Buffer.from([8, 1]) },
    ]);
  });

  test('falls back to the grpc-message text without the trailer', () => {
    const decoded = decodeStatus(
      Object.assign(new Error('x'), {
        code: grpc.status.ABORTED,
        details: 'plain',
        metadata: new grpc.Metadata(),
      }),
    );
    assert.deepEqual(
      {
        code: decoded.code,
        message: decoded.message,
        errorInfo: decoded.errorInfo,
        badRequest: decoded.badRequest,
      },
      { code: grpc.status.ABORTED, message: 'plain', errorInfo: null, badRequest: null },
    );
  });
});
