// The seedstore through the Node client, over TCP and over the Unix socket of one sidecar.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { checkHealth, connect, decodeStatus, grpc, SERVICE_NAMES, toDuration } from '../src/index.js';
import { startSidecar } from '../test-support/sidecars.js';

let sidecar;

before(async () => {
  sidecar = await startSidecar('seedstore');
});

after(async () => {
  if (sidecar === undefined) return; // `before` failed and said why
  const { code, socketLeft } = await sidecar.stop();
  assert.equal(code, 0, `seedstore exited with ${code} on SIGTERM; stderr:\n${sidecar.stderr()}`);
  assert.equal(socketLeft, false, 'seedstore left its socket file behind');
});

const collect = async (iterable) => {
  const items = [];
  for await (const item of iterable) items.push(item);
  return items;
};

for (const transport of ['tcp', 'uds']) {
  describe(`seedstore over ${transport}`, () => {
    // Each transport works in its own domain of the one shared store.
    const domain = `voice-${transport}`;
    let client;

    before(async () => {
      client = connect(sidecar[transport], { service: 'seedstore' });
      await client.waitForReady(10_000);
    });

    after(() => client.close());

    test('the target is the one the sidecar printed', () => {
      assert.match(client.target, transport === 'uds' ? /^unix:\/\/\/.+\.sock$/ : /^127\.0\.0\.1:\d+$/);
    });

    test('GetStore names the store under SKILLSPEC_HOME', async () => {
      const { seedStore } = await client.getStore({});
      assert.equal(seedStore, `${sidecar.home}/capabilities`);
    });

    test('two seeds are added and ranked with scores and reasons', async () => {
      const local = await client.addSeed({
        id: 'tts-local',
        domain,
        kind: 'cli',
        command: 'true',
        provides: ['text-to-speech'],
        preferredFor: ['text-to-speech'],
        priority: 80,
        evidenceCommands: ['true'],
      });
      assert.equal(local.seed.id, 'tts-local');
      assert.equal(local.seed.domain, domain);
      assert.equal(local.seed.rank.defaultPriority, 80);
      assert.match(local.path, new RegExp(`/capabilities/${domain}/tts-local\\.ya?ml$`));
      assert.ok(local.revision.length > 0);

      const cloud = await client.addSeed({
        id: 'tts-cloud',
        domain,
        kind: 'adapter',
        provides: ['speech-synthesis'],
        aliases: ['text-to-speech api'],
        externalService: true,
      });
      assert.deepEqual(cloud.seed.aliases, ['text-to-speech api']);

      const result = await client.searchSeeds({ capability: 'text-to-speech', domain });
      assert.equal(result.capability, 'text-to-speech');
      assert.equal(result.selectionPolicy, 'highest_score_after_constraints');
      assert.equal(result.selected, 'tts-local');
      assert.equal(result.askPolicy, null, 'a 53-point lead needs no ask');
      assert.deepEqual(
        result.candidates.map(({ id, score, reasons, risks, requiredGates }) => ({
          id,
          score,
          reasons,
          risks,
          requiredGates,
        })),
        [
          {
            id: 'tts-local',
            score: 40 - 20 + 10 + 8,
            reasons: [
              'direct provides match: text-to-speech',
              'missing verification',
              'preferred_for text-to-speech',
              'rank.default_priority 80 -> +8',
            ],
            risks: [],
            requiredGates: [],
          },
          {
            id: 'tts-cloud',
            score: 15 - 20 - 10,
            reasons: [
              'alias or evidence text match',
              'missing verification',
              'external or paid risk requires gate',
            ],
            risks: ['RISK_FLAG_EXTERNAL_SERVICE'],
            requiredGates: ['GATE_EXTERNAL_SERVICE_APPROVAL'],
          },
        ],
      );
    });

    test('VerifySeeds streams every check, then the verdict, and the ranking follows', async () => {
      const events = await collect(
        client.verifySeeds({ ids: ['tts-local'], domain, checkTimeout: toDuration(10) }),
      );
      assert.deepEqual(
        events.map((event) => event.event),
        ['checkStarted', 'checkFinished', 'checkStarted', 'checkFinished', 'seedVerified'],
      );
      assert.ok(events.every((event) => event.seedStore === `${sidecar.home}/capabilities`));
      const [lookupStarted, lookupFinished, commandStarted, commandFinished, verdict] = events;
      assert.deepEqual(lookupStarted.checkStarted, {
        id: 'tts-local',
        domain,
        check: 'path_lookup:true',
        index: 0,
      });
      assert.equal(lookupFinished.checkFinished.ok, true);
      assert.equal(lookupFinished.checkFinished.exitCode, undefined, 'a PATH lookup has no exit code');
      assert.deepEqual(commandStarted.checkStarted, {
        id: 'tts-local',
        domain,
        check: 'evidence_command:true',
        index: 1,
      });
      assert.equal(commandFinished.checkFinished.ok, true);
      assert.equal(commandFinished.checkFinished.exitCode, 0);
      assert.equal(commandFinished.checkFinished.timedOut, false);
      assert.equal(verdict.seedVerified.status, 'VERIFICATION_STATUS_VERIFIED');
      assert.deepEqual(
        verdict.seedVerified.outcomes.map(({ check, ok }) => [check, ok]),
        [
          ['path_lookup:true', true],
          ['evidence_command:true', true],
        ],
      );

      const listing = await client.listSeeds({ domain });
      const entry = listing.seeds.find((seed) => seed.id === 'tts-local');
      assert.equal(entry.verificationStatus, 'VERIFICATION_STATUS_VERIFIED');
      assert.equal(entry.revision, verdict.seedVerified.revision);

      const ranked = await client.searchSeeds({ capability: 'text-to-speech', domain });
      assert.equal(ranked.candidates[0].score, 40 + 25 + 10 + 8);
      assert.equal(ranked.candidates[0].reasons[1], 'verified evidence');
    });

    test('VerifySeeds of an unknown seed throws NOT_FOUND from the loop', async () => {
      const error = await collect(client.verifySeeds({ ids: ['no-such-seed'], domain })).then(
        (events) => assert.fail(`VerifySeeds of an unknown seed yielded ${events.length} events and ended`),
        (rejection) => rejection,
      );
      const status = decodeStatus(error);
      assert.equal(status.code, grpc.status.NOT_FOUND);
      assert.equal(status.errorInfo.reason, 'SEED_NOT_FOUND');
    });

    test('an unknown seed fails with NOT_FOUND and an ErrorInfo', async () => {
      const error = await client.inspectSeed({ id: 'no-such-seed', domain }).then(
        () => assert.fail('InspectSeed of an unknown id succeeded'),
        (rejection) => rejection,
      );
      const status = decodeStatus(error);
      assert.equal(status.code, grpc.status.NOT_FOUND);
      assert.equal(status.codeName, 'NOT_FOUND');
      assert.match(status.message, /no-such-seed/);
      assert.equal(status.errorInfo.reason, 'SEED_NOT_FOUND');
      assert.equal(status.errorInfo.domain, 'seedstore.agentsidecar');
      assert.equal(status.errorInfo.metadata.seedId, 'no-such-seed');
    });

    test('an invalid identifier fails with INVALID_ARGUMENT and a BadRequest', async () => {
      const error = await client.searchSeeds({ capability: 'Not An Identifier' }).then(
        () => assert.fail('a search for an invalid capability succeeded'),
        (rejection) => rejection,
      );
      const status = decodeStatus(error);
      assert.equal(status.code, grpc.status.INVALID_ARGUMENT);
      assert.ok(status.errorInfo.reason.length > 0);
      assert.ok(status.badRequest.fieldViolations.length >= 1);
      assert.ok(status.badRequest.fieldViolations.some((violation) => violation.field === 'capability'));
    });

    test('health is SERVING for the server and for the seedstore service', async () => {
      assert.equal(await checkHealth(sidecar[transport], ''), 'SERVING');
      assert.equal(await checkHealth(sidecar[transport], SERVICE_NAMES.seedstore), 'SERVING');
      const error = await checkHealth(sidecar[transport], 'no.such.Service').then(
        () => assert.fail('health of an unknown service succeeded'),
        (rejection) => rejection,
      );
      assert.equal(error.code, grpc.status.NOT_FOUND);
    });
  });
}

describe('WatchSeeds', () => {
  test('sees a seed added after the watch is subscribed, and stops when the loop breaks', async () => {
    const client = connect(sidecar.uds, { service: 'seedstore' });
    const domain = 'watched';
    try {
      const watch = client.watchSeeds({ domain }, { timeoutMs: 20_000 });
      const finalStatus = new Promise((resolve) => watch.call.once('status', resolve));
      await watch.waitForHeaders();
      await client.addSeed({ id: 'fresh', domain, kind: 'cli', provides: ['watching'] });
      let seen = null;
      for await (const change of watch) {
        seen = change;
        break;
      }
      assert.equal(seen.kind, 'CHANGE_KIND_ADDED');
      assert.equal(seen.id, 'fresh');
      assert.equal(seen.domain, domain);
      assert.deepEqual(seen.seed.provides, ['watching']);
      // Leaving the loop cancelled the call instead of leaving the watch open.
      assert.equal((await finalStatus).code, grpc.status.CANCELLED);
    } finally {
      client.close();
    }
  });
});
