// A small XMPP publish-subscribe client written with the npm library stanza: the README's
// XMPP example (and its walkthrough test).
//
//   node --experimental-websocket pubsub.mjs ACCOUNT sub NODE         (prints items; Ctrl-C)
//   node --experimental-websocket pubsub.mjs ACCOUNT pub NODE 'JSON'  (one item, then exits)
//
// The password is SMQP_PASSWORD; the server ws://HTTP_HOST:HTTP_PORT/xmpp-websocket
// (127.0.0.1:8000 unless set), its domain SMQP_XMPP_DOMAIN (localhost), the pubsub service
// pubsub.<domain>. Items carry their JSON in an XEP-0335 container (<json xmlns='urn:xmpp:json:0'>).
import * as XMPP from "stanza";

const [account, action, node, payload] = process.argv.slice(2);
if (!account || !["sub", "pub"].includes(action) || !node || (action === "pub" && !payload)) {
  console.error("usage: pubsub.mjs ACCOUNT sub NODE | pubsub.mjs ACCOUNT pub NODE 'JSON'");
  process.exit(2);
}
const domain = process.env.SMQP_XMPP_DOMAIN || "localhost";
const service = `pubsub.${domain}`;
const url = `ws://${process.env.HTTP_HOST || "127.0.0.1"}:${process.env.HTTP_PORT || 8000}/xmpp-websocket`;

function fail(what) {
  console.error(`error: ${what}`);
  process.exit(1);
}

let json;
if (action === "pub") {
  try {
    json = JSON.parse(payload);
  } catch (err) {
    fail(`not JSON: ${err.message}`);
  }
}

const client = XMPP.createClient({
  jid: `${account}@${domain}`, password: process.env.SMQP_PASSWORD,
  transports: { websocket: url, bosh: false },
});
client.on("auth:failed", () => fail("login failed"));
client.on("stream:error", (err) => fail(`stream error ${err.condition}`));
client.on("disconnected", () => {
  if (action === "sub") fail("disconnected");
});
const condition = (err) => err?.error?.condition || String(err);

client.on("pubsub:published", (msg) => {
  for (const item of msg.pubsub.items.published) {
    const content = item.content?.json !== undefined
      ? JSON.stringify(item.content.json) : "(a payload that is not a JSON container)";
    console.log(`${msg.pubsub.items.node} item ${item.id}: ${content}`);
  }
});

client.once("session:started", async () => {
  try {
    if (action === "sub") {
      await client.subscribeToNode(service, { node, jid: `${account}@${domain}` });
      // On stderr: a script may wait for it before it publishes.
      console.error(`subscribed to ${node} as ${client.jid}; waiting for items`);
    } else {
      const reply = await client.publish(service, node, { itemType: XMPP.Namespaces.NS_JSON_0, json });
      console.log(`published to ${node}: item ${reply.pubsub.publish.item.id}`);
      await client.disconnect();
      process.exit(0);
    }
  } catch (err) {
    fail(condition(err));
  }
});
client.connect();
