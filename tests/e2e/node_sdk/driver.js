// The Azure IoT device SDK for Node, unmodified, driven as its samples drive it, for the hub's interop tests
// (tests/e2e/test_node_sdk.py). One scenario per run; what happens is reported on stdout, one JSON object a line.
//
// Usage: node driver.js TRANSPORT SCENARIO SPEC_JSON
//   TRANSPORT  amqp | mqtt | amqp-ws | mqtt-ws (the SDK's Amqp, Mqtt, AmqpWs and MqttWs transports; the last two
//              dial port 443 whatever the gateway says, so a test gives them spec.proxy, an HTTP CONNECT proxy)
//   SCENARIO   device: telemetry (spec.messages), twin get and reported patch (spec.report), then "ready", and
//                      then spec.c2d cloud-to-device messages (completed, or as spec.c2d_outcomes says per message
//                      id: a list of "complete", "abandon", "reject", one a time it comes) and spec.methods calls
//                      of direct method "echo" (answered 200 with what it was sent), then "done"
//              module: twin get and reported patch, a desired-properties listener ("ready" once it has the whole
//                      desired document and the subscription is confirmed), then spec.patches patches and
//                      spec.methods calls of "echo" (as the device's), then "done"
//   SPEC_JSON  {"connection_string": ..., "ca": PEM file, "timeout_s": ..., "proxy": "http://host:port" (WebSocket
//              transports only)} and the scenario's own keys.
// Exit 0 when the scenario ran to its end; 1 with {"event": "error", ...} otherwise.
'use strict';

const fs = require('fs');
const { Client, ModuleClient, Message } = require('azure-iot-device');

const TRANSPORTS = {
  amqp: () => require('azure-iot-device-amqp').Amqp,
  mqtt: () => require('azure-iot-device-mqtt').Mqtt,
  'amqp-ws': () => require('azure-iot-device-amqp').AmqpWs,
  'mqtt-ws': () => require('azure-iot-device-mqtt').MqttWs,
};

// The WebSocket transports always dial {gateway}:443/$iothub/websocket; behind an HTTP proxy (spec.proxy, a URL)
// they take an agent, as the SDK's samples for proxies give them one (ClientOptions' webSocketAgent).
function options(transportName, spec) {
  const opts = { ca: fs.readFileSync(spec.ca, 'utf8') };
  if (spec.proxy) {
    const { HttpsProxyAgent } = require('https-proxy-agent');
    const agent = new HttpsProxyAgent(spec.proxy);
    if (transportName === 'amqp-ws') opts.amqp = { webSocketAgent: agent };
    else if (transportName === 'mqtt-ws') opts.mqtt = { webSocketAgent: agent };
    else throw new Error(`spec.proxy is for the WebSocket transports, not ${transportName}`);
  }
  return opts;
}

function say(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

function fail(err) {
  say({ event: 'error', type: (err && err.constructor && err.constructor.name) || 'Error', message: String(err && err.message || err) });
  process.exit(1);
}

function counter(total, onDone) {
  let seen = 0;
  if (total === 0) setImmediate(onDone);
  return () => {
    seen += 1;
    if (seen === total) onDone();
  };
}

// The twin as the SDK gets it, said; then the reported patch the spec asks for, if any. A device's or a module's.
async function twinReported(client, spec) {
  const twin = await client.getTwin();
  say({ event: 'twin', desired: twin.properties.desired, reported: twin.properties.reported });
  if (spec.report) {
    await new Promise((resolve, reject) => twin.properties.reported.update(spec.report, (err) => (err ? reject(err) : resolve())));
    say({ event: 'reported' });
  }
  return twin;
}

// The `echo` method's handler, a device's or a module's: says the call, answers 200 with its payload, then answered().
function echo(answered) {
  return (request, response) => {
    say({ event: 'method', name: request.methodName, payload: request.payload });
    response.send(200, { echo: request.payload }, (err) => {
      if (err) return fail(err);
      answered();
    });
  };
}

async function device(client, spec) {
  await client.open();
  say({ event: 'connected' });
  for (const [index, m] of (spec.messages || []).entries()) {
    const message = new Message(m.data);
    if (m.message_id) message.messageId = m.message_id;
    if (m.correlation_id) message.correlationId = m.correlation_id;
    if (m.content_type) message.contentType = m.content_type;
    if (m.content_encoding) message.contentEncoding = m.content_encoding;
    for (const [key, value] of Object.entries(m.properties || {})) message.properties.add(key, value);
    await client.sendEvent(message);
    say({ event: 'sent', index });
  }
  await twinReported(client, spec);
  await new Promise((resolve) => {
    let c2d = 0;
    let methods = 0;
    const check = () => {
      if (c2d >= (spec.c2d || 0) && methods >= (spec.methods || 0)) resolve();
    };
    const outcomes = spec.c2d_outcomes || {}; // message id -> what to answer each time it comes (else complete)
    client.on('message', (msg) => {
      const planned = outcomes[msg.messageId];
      const outcome = (planned && planned.shift()) || 'complete';
      client[outcome](msg, (err) => {
        if (err) return fail(err);
        say({
          event: 'c2d',
          outcome,
          data: msg.data.toString(),
          message_id: msg.messageId,
          correlation_id: msg.correlationId,
          properties: Object.fromEntries(msg.properties.propertyList.map((p) => [p.key, p.value])),
        });
        c2d += 1;
        check();
      });
    });
    client.onDeviceMethod('echo', echo(() => {
      methods += 1;
      check();
    }));
    say({ event: 'ready' });
  });
  await client.close();
  say({ event: 'done' });
}

async function module_(client, spec) {
  await client.open();
  say({ event: 'connected' });
  const twin = await twinReported(client, spec);
  await new Promise((resolve) => {
    let whole = null; // the first call: the whole desired document, as the SDK hands it to a new listener
    let subscribed = false;
    let patches = 0;
    let methods = 0;
    const check = () => {
      if (patches >= (spec.patches || 0) && methods >= (spec.methods || 0)) resolve();
    };
    const ready = () => {
      if (whole !== null && subscribed) {
        say({ event: 'ready', desired: whole });
        check();
      }
    };
    client.onMethod('echo', echo(() => {
      methods += 1;
      check();
    }));
    twin.on('properties.desired', (delta) => {
      if (whole === null) {
        whole = delta;
        ready();
        return;
      }
      patches += 1;
      say({ event: 'desired', patch: delta });
      check();
    });
    // The listener subscribes in the background and says nothing when it has; asking again (a public method of
    // the Twin) is answered once the hub has the subscription, so that "ready" means patches will arrive.
    twin.enableTwinDesiredPropertiesUpdates((err) => {
      if (err) return fail(err);
      subscribed = true;
      ready();
    });
  });
  await client.close();
  say({ event: 'done' });
}

async function main() {
  const [transportName, scenario, specJson] = process.argv.slice(2);
  const Transport = TRANSPORTS[transportName] && TRANSPORTS[transportName]();
  if (!Transport) throw new Error(`unknown transport ${transportName}`);
  const spec = JSON.parse(specJson);
  const make = scenario === 'module' ? ModuleClient : Client;
  const client = make.fromConnectionString(spec.connection_string, Transport);
  client.on('error', fail);
  await client.setOptions(options(transportName, spec));
  setTimeout(() => fail(new Error(`scenario ${scenario} not done in ${spec.timeout_s} s`)), spec.timeout_s * 1000).unref();
  if (scenario === 'device') await device(client, spec);
  else if (scenario === 'module') await module_(client, spec);
  else throw new Error(`unknown scenario ${scenario}`);
  process.exit(0);
}

main().catch(fail);
