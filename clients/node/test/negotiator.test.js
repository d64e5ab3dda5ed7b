// The negotiator (embedded default config: scripted "demo", command harness "shell-echo")
// through the Node client, over TCP and over the Unix socket of one sidecar.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { checkHealth, connect, decodeStatus, grpc, SERVICE_NAMES, toStruct } from '../src/index.js';
import { startSidecar } from '../test-support/sidecars.js';

let sidecar;

before(async () => {
  sidecar = await startSidecar('negotiator');
});

after(async () => {
  if (sidecar === undefined) return; // `before` failed and said why
  const { code, socketLeft } = await sidecar.stop();
  assert.equal(code, 0, `negotiator exited with ${code} on SIGTERM; stderr:\n${sidecar.stderr()}`);
  assert.equal(socketLeft, false, 'negotiator left its socket file behind');
});

const rejectionOf = (promise, what) =>
  promise.then(
    () => assert.fail(`${what} succeeded`),
    (error) => error,
  );

const OBJECT_SCHEMA = JSON.stringify({
  type: 'object',
  properties: { summary: { type: 'string' }, ok: { type: 'boolean' } },
  required: ['summary', 'ok'],
});

for (const transport of ['tcp', 'uds']) {
  describe(`negotiator over ${transport}`, () => {
    let client;

    before(async () => {
      client = connect(sidecar[transport], { service: 'negotiator' });
      await client.waitForReady(10_000);
    });

    after(() => client.close());

    test('ListAdapters lists the embedded demo adapters, sorted by shortname', async () => {
      const { adapters } = await client.listAdapters({});
      assert.deepEqual(
        adapters.map(({ declaration, implementation, source }) => [
          declaration.shortname,
          declaration.kind,
          implementation,
          source,
        ]),
        [
          ['demo', 'ADAPTER_KIND_AGENT_FRAMEWORK', 'scripted', 'ADAPTER_SOURCE_CONFIG'],
          ['shell-echo', 'ADAPTER_KIND_AGENT_HARNESS', 'command', 'ADAPTER_SOURCE_CONFIG'],
        ],
      );
      const demo = adapters[0].declaration;
      assert.equal(demo.scripted, true);
      assert.deepEqual(demo.acceptedSettings, ['seed', 'temperature']); // the negotiator sorts typed sets
      assert.match(demo.version, /^sha256:[0-9a-f]+$/);
    });

    test('a Produce the declaration meets is dispatched and returns the scripted output', async () => {
      const response = await client.produce({
        adapter: 'demo',
        prompt: 'summarise',
        outputSchema: OBJECT_SCHEMA,
        options: { settings: toStruct({ temperature: 0.2 }) },
      });
      assert.deepEqual(JSON.parse(response.outputJson), { summary: 'scripted reply', ok: true });
      assert.equal(response.decision.adapter, 'demo');
      assert.equal(response.decision.accepted, true);
      assert.deepEqual(response.decision.gaps, []);
      assert.ok(
        response.decision.verdicts.some(
          ({ requirement, state }) =>
            requirement.set === 'TYPED_SET_ACCEPTED_SETTINGS' &&
            requirement.member === 'temperature' &&
            state === 'CAPABILITY_STATE_SUPPORTED',
        ),
      );
    });

    test('Invoke on the command harness runs `cat` on the prompt', async () => {
      const response = await client.invoke({ agent: 'shell-echo', prompt: 'hello from node' });
      assert.equal(response.text.trim(), 'hello from node');
      assert.equal(response.decision.adapter, 'shell-echo');
    });

    test('invokeStream yields the decision, deltas as they come, then the whole text', async () => {
      const kinds = [];
      let text = '';
      let final;
      for await (const message of client.invokeStream({ invoke: { agent: 'shell-echo', prompt: 'one\ntwo' } })) {
        kinds.push(message.kind);
        if (message.kind === 'delta') text += message.delta;
        if (message.kind === 'final') final = message.final;
      }
      assert.equal(kinds[0], 'decision');
      assert.equal(kinds.at(-1), 'final');
      assert.ok(kinds.includes('delta'), `no delta in ${kinds}`);
      assert.equal(text, final.text);
      assert.equal(final.text.trim(), 'one\ntwo');
    });

    test('produceStream ends with the validated output', async () => {
      const messages = [];
      for await (const message of client.produceStream({
        produce: { adapter: 'demo', prompt: 'summarise', outputSchema: OBJECT_SCHEMA },
      })) {
        messages.push(message);
      }
      assert.equal(messages[0].kind, 'decision');
      assert.equal(messages[0].decision.adapter, 'demo');
      const { final } = messages.at(-1);
      assert.deepEqual(JSON.parse(final.outputJson), { summary: 'scripted reply', ok: true });
    });

    test('breaking out of invokeStream cancels the call', async () => {
      const stream = client.invokeStream({ invoke: { agent: 'shell-echo', prompt: 'hi' } });
      const status = new Promise((resolve) => stream.call.once('status', resolve));
      for await (const message of stream) {
        assert.equal(message.kind, 'decision');
        break;
      }
      assert.equal((await status).code, grpc.status.CANCELLED);
    });

    test('a refused invokeStream throws its status from the loop', async () => {
      const stream = client.invokeStream({
        invoke: { agent: 'shell-echo', prompt: 'hi', options: { requires: ['telepathy'] } },
      });
      const error = await rejectionOf(
        (async () => {
          for await (const _ of stream);
        })(),
        'invokeStream with an unknown requirement',
      );
      const status = decodeStatus(error);
      assert.equal(status.code, grpc.status.INVALID_ARGUMENT);
      assert.ok(status.errorInfo.reason, 'the status carries an ErrorInfo');
    });

    test('Produce to the command harness is refused: it cannot do structured output', async () => {
      const error = await rejectionOf(
        client.produce({ agent: 'shell-echo', prompt: 'hi', outputSchema: OBJECT_SCHEMA }),
        'Produce to shell-echo',
      );
      const status = decodeStatus(error);
      assert.equal(status.code, grpc.status.FAILED_PRECONDITION);
      assert.equal(status.errorInfo.reason, 'UNSUPPORTED_CAPABILITY');
      assert.equal(status.errorInfo.domain, 'negotiator.agentsidecar');
      assert.equal(status.errorInfo.metadata.adapter, 'shell-echo');
      assert.equal(status.errorInfo.metadata.gaps, 'structured_output');
      assert.match(status.errorInfo.metadata.declarationVersion, /^sha256:/);
      assert.deepEqual(status.preconditionFailure.violations, [
        {
          type: 'UNSUPPORTED_CAPABILITY',
          subject: 'structured_output',
          description:
            'output_schema needs structured_output; the declaration of "shell-echo" says unsupported',
        },
      ]);
      assert.equal(status.badRequest, null);
    });

    test('Produce to demo with an undeclared setting and an effort: one violation per gap', async () => {
      const error = await rejectionOf(
        client.produce({
          adapter: 'demo',
          prompt: 'hi',
          outputSchema: OBJECT_SCHEMA,
          options: { effort: 'high', settings: toStruct({ temperature: 0.1, top_k: 3 }) },
        }),
        'Produce with an undeclared setting',
      );
      const status = decodeStatus(error);
      assert.equal(status.code, grpc.status.FAILED_PRECONDITION);
      assert.equal(status.errorInfo.reason, 'UNSUPPORTED_CAPABILITY');
      assert.equal(status.errorInfo.metadata.adapter, 'demo');
      assert.equal(status.errorInfo.metadata.gaps, 'effort,accepted_settings:top_k');
      assert.deepEqual(
        status.preconditionFailure.violations.map(({ type, subject }) => [type, subject]),
        [
          ['UNSUPPORTED_CAPABILITY', 'effort'],
          ['UNSUPPORTED_CAPABILITY', 'accepted_settings:top_k'],
        ],
      );
      assert.match(status.preconditionFailure.violations[1].description, /^options\.settings\.top_k needs /);
    });

    test('options.requires: each entry is judged and named options.requires[i]; unknown names are INVALID_ARGUMENT', async () => {
      const error = await rejectionOf(
        client.invoke({ adapter: 'demo', prompt: 'hi', options: { requires: ['codemode', 'hook_events:pre_tool_use'] } }),
        'Invoke requiring codemode',
      );
      const status = decodeStatus(error);
      assert.equal(status.code, grpc.status.FAILED_PRECONDITION);
      assert.equal(status.errorInfo.reason, 'UNSUPPORTED_CAPABILITY');
      assert.deepEqual(
        status.preconditionFailure.violations.map(({ subject, description }) => [subject, description.split(' needs ')[0]]),
        [
          ['codemode', 'options.requires[0]'],
          ['hooks', 'options.requires[1]'],
          ['hook_events:pre_tool_use', 'options.requires[1]'],
        ],
      );

      const invalid = decodeStatus(
        await rejectionOf(
          client.invoke({ adapter: 'demo', prompt: 'hi', options: { requires: ['telepathy'] } }),
          'Invoke requiring an unknown capability',
        ),
      );
      assert.equal(invalid.code, grpc.status.INVALID_ARGUMENT);
      assert.deepEqual(
        invalid.badRequest.fieldViolations.map(({ field }) => field),
        ['options.requires[0]'],
      );
    });

    test('Negotiate reports the same gaps without dispatching', async () => {
      const { decision } = await client.negotiate({
        produce: { agent: 'shell-echo', prompt: 'hi', outputSchema: OBJECT_SCHEMA },
      });
      assert.equal(decision.accepted, false);
      assert.deepEqual(
        decision.gaps.map(({ requirement, state }) => [requirement.capability, state]),
        [['CAPABILITY_STRUCTURED_OUTPUT', 'CAPABILITY_STATE_UNSUPPORTED']],
      );
    });

    test('an unknown adapter fails with NOT_FOUND naming it', async () => {
      const status = decodeStatus(
        await rejectionOf(client.getAdapter({ shortname: 'nobody' }), 'GetAdapter of an unknown adapter'),
      );
      assert.equal(status.code, grpc.status.NOT_FOUND);
      assert.equal(status.errorInfo.metadata.adapter, 'nobody');
    });

    test('health is SERVING for the server and for the negotiator service', async () => {
      assert.equal(await checkHealth(sidecar[transport], ''), 'SERVING');
      assert.equal(await checkHealth(sidecar[transport], SERVICE_NAMES.negotiator), 'SERVING');
      const error = await rejectionOf(
        checkHealth(sidecar[transport], SERVICE_NAMES.seedstore),
        'the negotiator reporting health for the seedstore service',
      );
      assert.equal(error.code, grpc.status.NOT_FOUND);
    });
  });
}
