// Node client for the agentsidecar seedstore and negotiator sidecars.
//
// The .proto files are loaded at run time from the repository's protos/
// directory, so there is no generated code to keep in step with the Python
// side: the contract files are the single source of truth.

import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));

/** Directory holding agentsidecar/**.proto (the repository's protos/). */
export const PROTOS_DIR = path.resolve(here, '../../../protos');
/** Vendored google/rpc/{status,error_details}.proto. */
export const VENDORED_PROTOS_DIR = path.resolve(here, '../proto');
// grpc-health-check ships the canonical grpc.health.v1 proto; only the file is used.
const HEALTH_PROTO_DIR = path.resolve(
  path.dirname(require.resolve('grpc-health-check/package.json')),
  'proto',
);

export const SERVICE_NAMES = Object.freeze({
  seedstore: 'agentsidecar.seedstore.v1.SeedStoreService',
  negotiator: 'agentsidecar.negotiator.v1.NegotiatorService',
});
export const HEALTH_SERVICE_NAME = 'grpc.health.v1.Health';

const PROTO_FILES = [
  'agentsidecar/seedstore/v1/seedstore.proto',
  'agentsidecar/negotiator/v1/negotiator.proto',
  // The adapter contract, for remote adapters written in Node (examples/remote-adapter.js).
  'agentsidecar/adapter/v1/adapter.proto',
  'health/v1/health.proto',
];
const INCLUDE_DIRS = [PROTOS_DIR, VENDORED_PROTOS_DIR, HEALTH_PROTO_DIR];

// camelCase fields (the proto3 JSON names), enums as their names, uint64 as
// strings so no value is silently rounded, and `oneofs` so a message says which
// member of a oneof is set (e.g. `event: 'checkStarted'`). Fields of a oneof
// (including proto3 `optional` fields) stay undefined when unset.
export const LOADER_OPTIONS = Object.freeze({
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: INCLUDE_DIRS,
});

export const DEFAULT_UNARY_TIMEOUT_MS = 30_000;

let loaded = null;

/** The loaded gRPC package object (cached). */
export function loadProtos() {
  if (loaded === null) {
    const definition = protoLoader.loadSync(PROTO_FILES, LOADER_OPTIONS);
    loaded = grpc.loadPackageDefinition(definition);
  }
  return loaded;
}

function serviceConstructor(service) {
  const protos = loadProtos();
  switch (service) {
    case 'seedstore':
      return protos.agentsidecar.seedstore.v1.SeedStoreService;
    case 'negotiator':
      return protos.agentsidecar.negotiator.v1.NegotiatorService;
    default:
      throw new TypeError(`service must be "seedstore" or "negotiator", got ${JSON.stringify(service)}`);
  }
}

/**
 * Check a dial target: `unix:///abs/path`, `unix:/abs/path`, `unix:relative`
 * or `host:port` (`[v6]:port` too). Returns it unchanged; grpc-js dials all of them.
 */
export function checkTarget(target) {
  if (typeof target !== 'string' || target === '') {
    throw new TypeError('target must be a non-empty string');
  }
  if (target.startsWith('unix://')) {
    if (!target.slice('unix://'.length).startsWith('/')) {
      throw new TypeError(`unix:// targets need an absolute path: ${target}`);
    }
    return target;
  }
  if (target.startsWith('unix:')) {
    if (target.length === 'unix:'.length) throw new TypeError(`empty unix socket path: ${target}`);
    return target;
  }
  const match = /^(\[[0-9a-fA-F:.]+\]|[^:[\]]+):(\d{1,5})$/.exec(target);
  if (match === null || Number(match[2]) > 65535) {
    throw new TypeError(`target must be unix:///PATH or HOST:PORT, got ${JSON.stringify(target)}`);
  }
  return target;
}

function deadlineFrom(timeoutMs) {
  if (timeoutMs === null || timeoutMs === undefined || timeoutMs === Infinity) return Infinity;
  return new Date(Date.now() + timeoutMs);
}

function metadataFrom(headers) {
  if (headers instanceof grpc.Metadata) return headers;
  const metadata = new grpc.Metadata();
  for (const [key, value] of Object.entries(headers ?? {})) metadata.set(key, value);
  return metadata;
}

function lowerFirst(name) {
  return name.charAt(0).toLowerCase() + name.slice(1);
}

/**
 * Iterate a server stream. Leaving the loop early (break, throw) cancels the
 * call, so a WatchSeeds consumer that stops reading does not leave the stream
 * open on the server. A failed call throws its ServiceError from the loop.
 */
export function iterateStream(call) {
  let headers = null;
  let failure = null;
  // grpc-js emits a failed status as an 'error' event right after ending the
  // stream. Emitted before anyone iterates, it would be unhandled (crashing
  // the process) and the loop would then see a clean end; so it is recorded
  // here and thrown once the loop has drained the messages.
  call.on('error', (error) => {
    failure ??= error;
  });
  let endStatus = null;
  call.once('metadata', (received) => {
    headers = received;
  });
  call.once('status', (status) => {
    endStatus = status;
  });
  async function* messages() {
    try {
      try {
        for await (const message of call) yield message;
      } catch (error) {
        throw failure ?? error;
      }
      if (failure !== null) throw failure;
    } finally {
      call.cancel(); // no-op once the call has ended
    }
  }
  const iterator = messages();
  iterator.cancel = () => call.cancel();
  iterator.call = call;
  // Resolves with the response headers. WatchSeeds sends them once the watcher
  // is subscribed, so a change made after this resolves is never missed.
  iterator.waitForHeaders = () =>
    new Promise((resolve, reject) => {
      const ended = (status) =>
        reject(Object.assign(new Error(`stream ended before headers: ${status.details}`), status));
      if (headers !== null) resolve(headers);
      else if (endStatus !== null) ended(endStatus);
      else {
        call.once('metadata', resolve);
        call.once('status', ended);
      }
    });
  return iterator;
}

function wrapMethods(rawClient, methods, defaultUnaryTimeoutMs) {
  const wrapped = {};
  for (const [name, method] of Object.entries(methods)) {
    const jsName = lowerFirst(name);
    if (method.requestStream) continue; // neither service has client streams
    if (method.responseStream) {
      // Streams have no default deadline: WatchSeeds is meant to stay open.
      wrapped[jsName] = (request = {}, { timeoutMs, metadata } = {}) =>
        iterateStream(
          rawClient[name](request, metadataFrom(metadata), { deadline: deadlineFrom(timeoutMs) }),
        );
    } else {
      wrapped[jsName] = (request = {}, { timeoutMs = defaultUnaryTimeoutMs, metadata } = {}) =>
        new Promise((resolve, reject) => {
          rawClient[name](
            request,
            metadataFrom(metadata),
            { deadline: deadlineFrom(timeoutMs) },
            (error, response) => (error ? reject(error) : resolve(response)),
          );
        });
    }
  }
  return wrapped;
}

// --- paged listings (ListSeeds, ListAdapters: AIP-158) -----------------------------

/**
 * A server sent a `nextPageToken` it had sent before (or the one the walk
 * started from): following it would fetch the same pages for ever.
 */
export class PageTokenRepeatedError extends Error {
  constructor(method, token, pages) {
    super(
      `${method}: the server sent the page token ${JSON.stringify(token)} again after ${pages} ` +
        'page(s); the walk stops instead of fetching the same pages for ever',
    );
    this.name = 'PageTokenRepeatedError';
    this.method = method;
    this.token = token;
    this.pages = pages;
  }
}

/**
 * Every page of a paged listing, in order, as an async iterator: calls
 * `listPage({...request, pageToken}, opts)` (a client's `listSeeds` or
 * `listAdapters`), starting from `request.pageToken` (empty: the first page),
 * each time with the `nextPageToken` of the page before, and ends after a
 * page whose `nextPageToken` is empty. Each page is its own call, with its own
 * deadline from `opts.timeoutMs`. A token the walk has already used throws
 * PageTokenRepeatedError (named after `method`); a failed page rejects with its
 * ServiceError. `request` is not modified.
 */
export async function* walkPages(listPage, request = {}, opts = {}, method = 'List') {
  let token = request.pageToken ?? '';
  const used = new Set([token]);
  for (let pages = 1; ; pages += 1) {
    const page = await listPage({ ...request, pageToken: token }, opts);
    yield page;
    const next = page.nextPageToken ?? '';
    if (next === '') return;
    if (used.has(next)) throw new PageTokenRepeatedError(method, next, pages);
    used.add(next);
    token = next;
  }
}

async function collectPages(listPage, request, opts, method) {
  const pages = [];
  for await (const page of walkPages(listPage, request, opts, method)) pages.push(page);
  return pages;
}

/** One ListSeeds reply holding every page's seeds and problems, in order; `nextPageToken` empty. */
export function mergeSeedPages(pages) {
  return {
    ...(pages[0] ?? { seedStore: '' }),
    seeds: pages.flatMap((page) => page.seeds),
    problems: pages.flatMap((page) => page.problems),
    nextPageToken: '',
  };
}

function pagingMethods(service, methods) {
  if (service === 'seedstore') {
    return {
      listAllSeeds: async (request = {}, opts = {}) =>
        mergeSeedPages(await collectPages(methods.listSeeds, request, opts, 'ListSeeds')),
    };
  }
  return {
    listAllAdapters: async (request = {}, opts = {}) => {
      const pages = await collectPages(methods.listAdapters, request, opts, 'ListAdapters');
      return { adapters: pages.flatMap((page) => page.adapters), nextPageToken: '' };
    },
  };
}

/**
 * Connect to a sidecar. `service` is "seedstore" or "negotiator".
 *
 * Returns an object with one method per RPC in lowerCamelCase: unary RPCs
 * return promises (default deadline 30 s, override per call with
 * `{timeoutMs}`; `null` for none), server-streaming RPCs (VerifySeeds,
 * WatchSeeds, WatchAdapters, InvokeStream, ProduceStream) return async
 * iterators; leaving the loop early cancels the call. The paged listings also
 * have a method that walks every page (`listAllSeeds`, `listAllAdapters`;
 * `walkPages`). Also `waitForReady(ms)`, `close()`, `raw` (the grpc-js client)
 * and `target`.
 */
export function connect(target, { service, credentials, channelOptions, defaultUnaryTimeoutMs } = {}) {
  const Constructor = serviceConstructor(service);
  const raw = new Constructor(
    checkTarget(target),
    credentials ?? grpc.credentials.createInsecure(),
    channelOptions ?? {},
  );
  const methods = wrapMethods(raw, Constructor.service, defaultUnaryTimeoutMs ?? DEFAULT_UNARY_TIMEOUT_MS);
  return {
    ...methods,
    ...pagingMethods(service, methods),
    service: SERVICE_NAMES[service],
    target,
    raw,
    waitForReady(timeoutMs = 5_000) {
      return new Promise((resolve, reject) =>
        raw.waitForReady(deadlineFrom(timeoutMs), (error) => (error ? reject(error) : resolve())),
      );
    },
    close() {
      raw.close();
    },
  };
}

/**
 * Ask `grpc.health.v1.Health/Check` for `service` ("" = the whole server).
 * Resolves to the status name ("SERVING", "NOT_SERVING", ...); rejects with
 * the ServiceError (NOT_FOUND for a service the server does not know).
 */
export async function checkHealth(target, service = '', { timeoutMs = 5_000, credentials } = {}) {
  const Health = loadProtos().grpc.health.v1.Health;
  const client = new Health(checkTarget(target), credentials ?? grpc.credentials.createInsecure());
  try {
    const response = await new Promise((resolve, reject) =>
      client.check({ service }, { deadline: deadlineFrom(timeoutMs) }, (error, reply) =>
        error ? reject(error) : resolve(reply),
      ),
    );
    return response.status;
  } finally {
    client.close();
  }
}

// --- rich error details (google.rpc.Status in grpc-status-details-bin) ------------

const STATUS_DETAILS_KEY = 'grpc-status-details-bin';
const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

let statusRoot = null;

function rpcTypes() {
  if (statusRoot === null) {
    const root = new protobuf.Root();
    root.resolvePath = (_origin, target) => {
      // google/protobuf/* are protobufjs's built-in well-known types.
      if (target.startsWith('google/protobuf/')) return target;
      return path.join(VENDORED_PROTOS_DIR, target);
    };
    root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: false });
    root.resolveAll();
    statusRoot = root;
  }
  return {
    Status: statusRoot.lookupType('google.rpc.Status'),
    lookup: (fullName) => {
      try {
        return statusRoot.lookupType(fullName);
      } catch {
        return null;
      }
    },
  };
}

const TO_OBJECT = { longs: String, enums: String, defaults: true, arrays: true, objects: true };

function durationSeconds(duration) {
  return Number(duration.seconds) + Number(duration.nanos) / 1e9;
}

/**
 * Decode a failed call's status and its details.
 *
 * Returns {code, codeName, message, errorInfo, badRequest, preconditionFailure,
 * retryDelaySeconds, otherDetails}: `errorInfo` is {reason, domain, metadata}
 * or null, `badRequest` is {fieldViolations: [{field, description}]} or null,
 * `preconditionFailure` is {violations: [{type, subject, description}]} or
 * null. Works on any error with grpc-js's `code`/`details`/`metadata`; a call
 * without the trailer yields nulls.
 */
export function decodeStatus(error) {
  const code = typeof error?.code === 'number' ? error.code : grpc.status.UNKNOWN;
  const decoded = {
    code,
    codeName: CODE_NAMES[code] ?? 'UNKNOWN',
    message: error?.details ?? error?.message ?? '',
    errorInfo: null,
    badRequest: null,
    preconditionFailure: null,
    retryDelaySeconds: null,
    otherDetails: [],
  };
  const trailer = error?.metadata instanceof grpc.Metadata ? error.metadata.get(STATUS_DETAILS_KEY) : [];
  if (trailer.length === 0) return decoded;
  const { Status, lookup } = rpcTypes();
  const status = Status.decode(trailer[0]);
  if (status.message) decoded.message = status.message;
  for (const detail of status.details) {
    // protobufjs's built-in Any keeps the proto field name whatever keepCase says.
    const typeUrl = detail.type_url ?? detail.typeUrl ?? '';
    const typeName = typeUrl.slice(typeUrl.lastIndexOf('/') + 1);
    const type = lookup(typeName);
    if (type === null) {
      decoded.otherDetails.push({ typeUrl, value: Buffer.from(detail.value) });
      continue;
    }
    const value = type.toObject(type.decode(detail.value), TO_OBJECT);
    switch (typeName) {
      case 'google.rpc.ErrorInfo':
        decoded.errorInfo = { reason: value.reason, domain: value.domain, metadata: { ...value.metadata } };
        break;
      case 'google.rpc.BadRequest':
        decoded.badRequest = {
          fieldViolations: value.fieldViolations.map(({ field, description }) => ({ field, description })),
        };
        break;
      case 'google.rpc.PreconditionFailure':
        decoded.preconditionFailure = {
          violations: value.violations.map(({ type: kind, subject, description }) => ({
            type: kind,
            subject,
            description,
          })),
        };
        break;
      case 'google.rpc.RetryInfo':
        decoded.retryDelaySeconds = durationSeconds(value.retryDelay ?? { seconds: 0, nanos: 0 });
        break;
      default:
        decoded.otherDetails.push({ typeUrl, value });
    }
  }
  return decoded;
}

// --- request helpers ----------------------------------------------------------------

/** A plain JSON value as a google.protobuf.Value message object. */
export function toValue(value) {
  if (value === null || value === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof value === 'number') return { numberValue: value };
  if (typeof value === 'string') return { stringValue: value };
  if (typeof value === 'boolean') return { boolValue: value };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  if (typeof value === 'object') return { structValue: toStruct(value) };
  throw new TypeError(`not a JSON value: ${typeof value}`);
}

/** A plain JSON object as a google.protobuf.Struct message object (e.g. CallOptions.settings). */
export function toStruct(object) {
  return { fields: Object.fromEntries(Object.entries(object).map(([key, value]) => [key, toValue(value)])) };
}

/** A number of seconds as a google.protobuf.Duration message object. */
export function toDuration(seconds) {
  const whole = Math.floor(seconds);
  return { seconds: String(whole), nanos: Math.round((seconds - whole) * 1e9) };
}

export { grpc };
