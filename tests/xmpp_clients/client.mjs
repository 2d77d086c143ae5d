// One XMPP client process for the tests, driven by a JSON argument, reporting JSON lines on
// stdout. Written against two independent npm libraries (not this project's code):
//   lib "xmpp":   @xmpp/client (raw IQs; PLAIN, as it offers PLAIN and SCRAM-SHA-1 only)
//   lib "stanza": stanza (its pubsub API; it picks SCRAM-SHA-256)
// Modes: "worker" (queue node: subscribe with pubsub#queue_requests, retract what arrives,
// unlock every Nth item once, leave every Mth item to time out once), "subscriber" (fan-out:
// subscribe and report items), "listen" (report items of existing subscriptions: the
// backlog on bind), "publisher" (publish `count` items). "create": create the node first;
// "presence": send initial presence once online.
// Node 20: run with --experimental-websocket (global WebSocket).
import { client as xmppClient, xml } from "@xmpp/client";
import * as XMPP from "stanza";

const cfg = JSON.parse(process.argv[2]);
const PUBSUB = "http://jabber.org/protocol/pubsub";
const EVENT = PUBSUB + "#event";
const QUEUEING = "urn:xmpp:pubsub:queueing:0";
const SUBOPTS = PUBSUB + "#subscribe_options";
const service = cfg.service || "pubsub.localhost";
const domain = cfg.domain || "localhost";
const bare = `${cfg.user}@${domain}`;

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

const seen = new Map(); // item id -> times received
let received = 0;

function decide(id) {
  // What a worker does with an item: unlock (once), ignore (once), or consume.
  const times = (seen.get(id) || 0) + 1;
  seen.set(id, times);
  received += 1;
  if (times === 1 && cfg.unlockEvery && received % cfg.unlockEvery === 0) return "unlock";
  if (times === 1 && cfg.ignoreEvery && received % cfg.ignoreEvery === 0) return "ignore";
  return "consume";
}

function rawEvents(text) {
  // Unlock and retract notifications, read from the raw stanza (stanza has no XEP-0254).
  for (const m of text.matchAll(/<unlock[^>]*xmlns=["']urn:xmpp:pubsub:queueing:0["'][^>]*>/g)) {
    const id = /id=["']([^"']+)["']/.exec(m[0]);
    if (id) out({ event: "unlocked", id: id[1] });
  }
}

async function runXmpp() {
  const xmpp = xmppClient({
    service: cfg.url, domain, resource: cfg.resource, username: cfg.user,
    password: cfg.password,
  });
  xmpp.on("error", (err) => out({ event: "error", message: String(err) }));
  const iq = (type, child) => xmpp.iqCaller.request(xml("iq", { type, to: service }, child));
  const pubsub = (...children) => xml("pubsub", { xmlns: PUBSUB }, ...children);
  const handle = async (id) => {
    const what = decide(id);
    out({ event: "item", id, what });
    try {
      if (what === "unlock") {
        await iq("set", xml("unlock", { xmlns: QUEUEING, node: cfg.node }, xml("item", { id })));
      } else if (what === "consume") {
        await iq("set", pubsub(xml("retract", { node: cfg.node }, xml("item", { id }))));
        out({ event: "consumed", id });
      }
    } catch (err) {
      out({ event: "refused", id, what, condition: err.condition || String(err) });
    }
  };
  xmpp.on("stanza", (st) => {
    if (!st.is("message")) return;
    const items = st.getChild("event", EVENT)?.getChild("items");
    if (!items) return;
    for (const item of items.getChildren("item")) {
      if (cfg.mode === "worker") {
        handle(item.attrs.id);
      } else {
        const payload = item.children.find((c) => typeof c !== "string");
        out({ event: "item", id: item.attrs.id, node: items.attrs.node,
              payload: payload ? payload.toString() : "" });
      }
    }
    for (const u of items.getChildren("unlock", QUEUEING)) out({ event: "unlocked", id: u.attrs.id });
    for (const r of items.getChildren("retract")) out({ event: "retract", id: r.attrs.id });
  });
  await xmpp.start();
  out({ event: "online", jid: xmpp.jid.toString() });
  if (cfg.create) {
    try {
      await iq("set", pubsub(xml("create", { node: cfg.node })));
      out({ event: "created" });
    } catch (err) {
      out({ event: "create-refused", condition: err.condition || String(err) });
    }
  }
  if (cfg.presence) xmpp.send(xml("presence"));
  if (cfg.mode === "worker" || cfg.mode === "subscriber") {
    const options = cfg.mode === "worker"
      ? [xml("options", { node: cfg.node, jid: bare },
          xml("x", { xmlns: "jabber:x:data", type: "submit" },
            xml("field", { var: "FORM_TYPE", type: "hidden" }, xml("value", {}, SUBOPTS)),
            xml("field", { var: "pubsub#queue_requests" },
              xml("value", {}, String(cfg.queueRequests || 1)))))]
      : [];
    await iq("set", pubsub(xml("subscribe", { node: cfg.node, jid: bare }), ...options));
    out({ event: "subscribed" });
  }
  if (cfg.mode === "publisher") {
    for (let i = 0; i < cfg.count; i++) {
      const reply = await iq("set", pubsub(xml("publish", { node: cfg.node },
        xml("item", cfg.ids ? { id: `${cfg.prefix || "i"}${i}` } : {},
          xml("entry", { xmlns: "urn:test:entry" }, String(i))))));
      const ps = reply.is("pubsub") ? reply : reply.getChild("pubsub", PUBSUB);
      out({ event: "published", id: ps.getChild("publish").getChild("item").attrs.id });
    }
    await xmpp.stop();
    process.exit(0);
  }
}

async function runStanza() {
  const c = XMPP.createClient({
    jid: bare, password: cfg.password, resource: cfg.resource,
    transports: { websocket: cfg.url, bosh: false },
  });
  // XEP-0254's unlock, which stanza does not know: one definition for its IQ.
  c.stanzas.define({
    element: "unlock", namespace: QUEUEING, path: "iq.queueUnlock",
    fields: {
      node: XMPP.JXT.attribute("node"),
      item: XMPP.JXT.childAttribute(QUEUEING, "item", "id"),
    },
  });
  c.on("raw:incoming", (text) => rawEvents(text));
  c.on("stream:error", (err) => out({ event: "error", message: JSON.stringify(err) }));
  c.on("auth:failed", () => out({ event: "error", message: "auth failed" }));
  const handle = async (id) => {
    const what = decide(id);
    out({ event: "item", id, what });
    try {
      if (what === "unlock") {
        await c.sendIQ({ type: "set", to: service, queueUnlock: { node: cfg.node, item: id } });
      } else if (what === "consume") {
        await c.retract(service, cfg.node, id, false);
        out({ event: "consumed", id });
      }
    } catch (err) {
      const condition = err?.error?.condition || String(err);
      out({ event: "refused", id, what, condition });
    }
  };
  c.on("pubsub:published", (msg) => {
    for (const item of msg.pubsub.items.published) {
      if (cfg.mode === "worker") handle(item.id);
      else out({ event: "item", id: item.id, node: msg.pubsub.items.node });
    }
  });
  c.on("pubsub:retracted", (msg) => {
    for (const r of msg.pubsub.items.retracted) out({ event: "retract", id: r.id });
  });
  const started = new Promise((resolve) => c.once("session:started", resolve));
  c.connect();
  await started;
  out({ event: "online", jid: c.jid });
  if (cfg.presence) c.sendPresence();
  if (cfg.mode === "worker" || cfg.mode === "subscriber") {
    const opts = { node: cfg.node, jid: bare };
    if (cfg.mode === "worker") {
      opts.options = {
        type: "submit",
        fields: [
          { name: "FORM_TYPE", type: "hidden", value: SUBOPTS },
          { name: "pubsub#queue_requests", value: String(cfg.queueRequests || 1) },
        ],
      };
    }
    await c.subscribeToNode(service, opts);
    out({ event: "subscribed" });
  }
}

process.on("unhandledRejection", (err) => out({
  event: "error", message: err instanceof Error ? String(err) : JSON.stringify(err) }));
(cfg.lib === "stanza" ? runStanza() : runXmpp()).catch((err) => {
  out({ event: "error",
        message: err instanceof Error ? String(err.stack || err) : JSON.stringify(err) });
  process.exit(2);
});
