// A remote adapter in Node: agentsidecar.adapter.v1.AdapterService served with grpc-js,
// for a negotiator to broker (register it with RegisterAdapter, or `implementation: remote`
// in the negotiator's config). The contract is in protos/README.md, "The adapter contract".
//
// It declares an agent framework with structured output, streaming (stream_events) and
// the caller's tools; every other capability is left undeclared (UNKNOWN), so the
// negotiator refuses calls that need one unless the caller allows it. Its "model" is a stub:
//
//   Invoke:  "node:" + prompt; InvokeStream sends it word by word, WORD_INTERVAL_MS apart
//   Produce: {"echo": prompt} (ProduceStream: the same, as its final)
//   with tools, a prompt "tool:<name>:<JSON arguments>" calls that tool once and answers
//   "node:" + {"tool", "result"} or {"tool", "error", "denied"}; streamed (start.stream),
//   it first sends the delta "calling <name> ".
//
//   node examples/remote-adapter.js --listen unix:/tmp/node-adapter.sock [--shortname node-echo]
//
// prints "READY <address>" once serving and stops on SIGTERM or SIGINT.

import process from 'node:process';
import { fileURLToPath } from 'node:url';

import { grpc, loadProtos } from '../src/index.js';

const SUPPORTED = ['CAPABILITY_STRUCTURED_OUTPUT', 'CAPABILITY_STREAM_EVENTS', 'CAPABILITY_TOOL_REGISTRATION'];
export const WORD_INTERVAL_MS = 50;

function declaration(shortname) {
  return {
    shortname,
    kind: 'ADAPTER_KIND_AGENT_FRAMEWORK',
    capabilities: SUPPORTED.map((capability) => ({ capability, state: 'CAPABILITY_STATE_SUPPORTED' })),
  };
}

/** What one tool outcome says, as the stub model reports it. */
function outcomeJson(name, outcome) {
  if (outcome.outcome === 'resultJson') {
    try {
      return { tool: name, result: JSON.parse(outcome.resultJson) };
    } catch (error) {
      return { tool: name, error: `the result is not JSON: ${error.message}`, denied: false };
    }
  }
  return { tool: name, error: outcome.error, denied: outcome.denied };
}

/**
 * CallWithTools: `start`, then for a "tool:" prompt one tool call and its outcome,
 * then the reply. A request stream that ends first means the call was cancelled.
 */
function callWithTools(call) {
  let start = null;
  let pending = null; // the tool call waiting for its outcome
  const reply = (text) => {
    if (start.call === 'produce') {
      call.write({ produce: { outputJson: JSON.stringify({ echo: start.produce.prompt, tool: text }) } });
    } else {
      call.write({ invoke: { text: `node:${typeof text === 'string' ? text : JSON.stringify(text)}` } });
    }
    call.end();
  };
  call.on('data', (message) => {
    if (start === null) {
      if (message.message !== 'start') {
        call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: 'the first message must be start' });
        return;
      }
      start = message.start;
      const prompt = start[start.call].prompt;
      const match = /^tool:([^:]+):(.*)$/s.exec(prompt);
      if (match === null) {
        reply(prompt);
        return;
      }
      pending = { callId: 'node-call-1', name: match[1] };
      if (start.stream) call.write({ delta: `calling ${pending.name} ` });
      call.write({ toolCall: { callId: pending.callId, name: pending.name, argumentsJson: match[2] } });
      return;
    }
    if (message.message !== 'toolOutcome' || pending === null || message.toolOutcome.callId !== pending.callId) {
      call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: 'expected the outcome of the tool call' });
      return;
    }
    const outcome = outcomeJson(pending.name, message.toolOutcome);
    pending = null;
    reply(outcome);
  });
}

/**
 * InvokeStream: the reply a word at a time, then the whole text as `final`. A caller that
 * goes away cancels the call: the timer stops and nothing more is sent.
 */
function invokeStream(call, onCancelled) {
  const text = `node:${call.request.invoke.prompt}`;
  const words = text.split(/(?<= )/); // each word with the space after it
  if (call.request.invoke.options?.streamEvents) call.write({ event: { type: 'started' } });
  let sent = 0;
  let ended = false;
  const timer = setInterval(() => {
    if (sent < words.length) {
      call.write({ delta: words[sent] });
      sent += 1;
      return;
    }
    clearInterval(timer);
    ended = true;
    call.write({ final: { text } });
    call.end();
  }, WORD_INTERVAL_MS);
  // grpc-js also reports a call that ended normally as cancelled once its stream closes.
  call.on('cancelled', () => {
    clearInterval(timer);
    if (!ended) onCancelled?.(call.request.invoke.prompt);
  });
}

/**
 * Serve the adapter on `listen` (unix:PATH or HOST:PORT); resolves to {address, stop()}.
 * `onCancelled(prompt)`, if given, runs when a caller cancels an InvokeStream.
 */
export async function startNodeAdapter({ listen, shortname = 'node-echo', onCancelled }) {
  const { AdapterService } = loadProtos().agentsidecar.adapter.v1;
  const server = new grpc.Server();
  server.addService(AdapterService.service, {
    // Revision 1 of the contract: CallWithTools and the fields that came with it.
    getDeclaration: (_call, done) => done(null, { declaration: declaration(shortname), contractRevision: 1 }),
    invoke: (call, done) => done(null, { text: `node:${call.request.prompt}` }),
    produce: (call, done) => done(null, { outputJson: JSON.stringify({ echo: call.request.prompt }) }),
    invokeStream: (call) => invokeStream(call, onCancelled),
    produceStream: (call) => {
      call.write({ final: { outputJson: JSON.stringify({ echo: call.request.produce.prompt }) } });
      call.end();
    },
    callWithTools,
  });
  const port = await new Promise((resolve, reject) =>
    server.bindAsync(listen, grpc.ServerCredentials.createInsecure(), (error, bound) =>
      error ? reject(error) : resolve(bound),
    ),
  );
  const address = listen.startsWith('unix:') ? listen : `${listen.slice(0, listen.lastIndexOf(':'))}:${port}`;
  return {
    address,
    stop: () => new Promise((resolve) => server.tryShutdown(() => resolve())),
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const option = (name, fallback) => {
    const index = process.argv.indexOf(name);
    return index === -1 ? fallback : process.argv[index + 1];
  };
  const listen = option('--listen');
  if (listen === undefined) {
    console.error('usage: node examples/remote-adapter.js --listen unix:PATH|HOST:PORT [--shortname NAME]');
    process.exit(2);
  }
  const adapter = await startNodeAdapter({ listen, shortname: option('--shortname', 'node-echo') });
  console.log(`READY ${adapter.address}`);
  for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => adapter.stop().then(() => process.exit(0)));
}
