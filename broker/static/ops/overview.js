// The overview: fetch overview.json now and every REFRESH_MS, draw the rate charts
// (Chart.js, vendored under vendor/) and fill the tables. No framework: a few tables.
(function () {
  "use strict";
  const REFRESH_MS = 3000;
  const root = document.getElementById("ops-overview");
  if (!root) return;
  const COLORS = { publish: "#417690", deliver: "#e0a030", ack: "#2a9a4a" };
  const charts = {};

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function labels(series) {
    const start = Date.parse(series.start);
    return series.publish.map((_, i) => {
      const d = new Date(start + i * series.step_seconds * 1000);
      return d.toISOString().slice(11, 16);
    });
  }

  // The last bucket is the current minute (hour), not over yet: drawn, it would drop toward
  // zero at every refresh. The line stops at the last finished one; the caption under the
  // chart tells the current one so far.
  function finished(series, id, unit) {
    const n = series.publish.length - 1;
    const caption = document.getElementById(id + "-sofar");
    if (caption) {
      caption.textContent = `this ${unit} so far: ` + ["publish", "deliver", "ack"]
        .map((k) => `${series[k][n]} ${k === "ack" ? "ACKed" : k + "ed"}`).join(", ");
      for (const k of ["publish", "deliver", "ack"]) caption.dataset[k] = series[k][n];
    }
    const out = { start: series.start, step_seconds: series.step_seconds };
    for (const k of ["publish", "deliver", "ack"]) out[k] = series[k].slice(0, n);
    return out;
  }

  function drawChart(id, series, unit) {
    series = finished(series, id, unit);
    const data = {
      labels: labels(series),
      datasets: ["publish", "deliver", "ack"].map((kind) => ({
        label: kind, data: series[kind], borderColor: COLORS[kind],
        backgroundColor: COLORS[kind], pointRadius: 0, borderWidth: 2, tension: 0.2,
      })),
    };
    if (charts[id]) {
      charts[id].data = data;
      charts[id].update("none");
      return;
    }
    if (typeof Chart === "undefined") return;
    charts[id] = new Chart(document.getElementById(id), {
      type: "line", data: data,
      options: { animation: false, responsive: true,
                 scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }

  function topicLink(path) {
    const a = el("a", { href: root.dataset.topicUrl + "?path=" + encodeURIComponent(path) }, path);
    return a;
  }

  function render(s) {
    drawChart("ops-rate-minutes", s.rates.minutes, "minute");
    drawChart("ops-rate-hours", s.rates.hours, "hour");

    const doors = Object.entries(s.sessions.by_door).sort();
    fill(document.querySelector("#ops-sessions tbody"), [
      ...doors.map(([door, n]) => {
        const tr = el("tr");
        tr.append(el("th", {}, door.toUpperCase()), el("td", { class: "num", "data-door": door }, n));
        return tr;
      }),
      (() => { const tr = el("tr"); tr.append(el("th", {}, "total"),
        el("td", { class: "num", "data-door": "total" }, s.sessions.total)); return tr; })(),
    ]);

    fill(document.querySelector("#ops-totals tbody"), Object.entries(s.totals).map(([k, n]) => {
      const tr = el("tr");
      tr.append(el("th", {}, k), el("td", { class: "num", "data-total": k }, n));
      return tr;
    }));

    fill(document.querySelector("#ops-commits tbody"), Object.entries(s.group_commits).map(([lane, c]) => {
      const tr = el("tr");
      tr.append(el("th", {}, lane), el("td", { class: "num", "data-commits": lane }, c.count),
        el("td", { class: "num" }, c.mean_size === null ? "–" : c.mean_size.toFixed(1)),
        el("td", { class: "num" }, c.mean_seconds === null ? "–" : (c.mean_seconds * 1000).toFixed(1)),
        el("td", { class: "num" }, c.failures));
      return tr;
    }));

    const topics = s.topics.length ? s.topics.map((t) => {
      const tr = el("tr", { "data-topic": t.path });
      const name = el("td"); name.append(topicLink(t.path));
      tr.append(name);
      for (const f of ["messages", "pending", "locked", "dead"]) {
        tr.append(el("td", { class: "num", "data-field": f }, t[f]));
      }
      return tr;
    }) : [(() => { const tr = el("tr"); tr.append(el("td", { colspan: 5 }, "No messages waiting.")); return tr; })()];
    fill(document.querySelector("#ops-topics tbody"), topics);

    const canRepublish = root.dataset.canRepublish === "1";
    const dead = s.dead_letters.length ? s.dead_letters.map((d) => {
      const tr = el("tr", { "data-smuid": d.smuid });
      const topic = el("td"); topic.append(topicLink(d.topic));
      const action = el("td");
      if (canRepublish && d.republishable) {
        const b = el("button", { type: "button", class: "ops-republish", "data-smuid": d.smuid }, "Republish");
        b.addEventListener("click", () => republish(d.smuid));
        action.append(b);
      } else if (!d.republishable) {
        action.textContent = "still " + d.message_state;
      }
      tr.append(el("td", {}, d.smuid), topic, el("td", {}, d.account), el("td", { class: "num" }, d.attempts || "–"),
        el("td", {}, d.at ? d.at.slice(0, 19).replace("T", " ") : ""), action);
      return tr;
    }) : [(() => { const tr = el("tr"); tr.append(el("td", { colspan: 6 }, "No dead letters.")); return tr; })()];
    fill(document.querySelector("#ops-dead tbody"), dead);

    const listeners = s.listeners.length ? s.listeners.map((l) => {
      const tr = el("tr");
      const lanes = el("td");
      if (!l.storage_processes.length) lanes.textContent = "in the listener (no storage processes)";
      for (const p of l.storage_processes) {
        const span = el("span", { class: p.alive ? "ops-ok" : "ops-bad", "data-lane": p.name },
          `${p.name} ${p.alive ? "up" : "DOWN"} (pid ${p.pid ?? "–"}, started ${p.starts}×, waiting ${p.waiting}) `);
        lanes.append(span);
      }
      tr.append(el("td", { "data-field": "role" }, l.role || l.command || "–"), el("td", {}, l.host),
        el("td", {}, l.pid + (l.command ? " (" + l.command + ")" : "")), el("td", { class: "num" }, l.sessions), lanes,
        el("td", {}, Math.max(0, Math.round(Date.now() / 1000 - l.at)) + " s ago"));
      return tr;
    }) : [(() => { const tr = el("tr"); tr.append(el("td", { colspan: 6 }, "No listener has reported (none running, or Redis unreachable).")); return tr; })()];
    fill(document.querySelector("#ops-listeners tbody"), listeners);

    const links = document.getElementById("ops-links-section");
    links.hidden = s.links === null;
    // A link that is not up (and not disabled on purpose) is marked: it is what an
    // operator must look at (its peer keeps queueing meanwhile: the backlog).
    const linkRows = (s.links || []).length ? s.links.map((k) => {
      const tr = el("tr", { "data-link": k.name, "data-state": k.state });
      const down = k.enabled && !k.up;
      const state = el("td", { class: down ? "ops-bad" : (k.up ? "ops-ok" : "") },
        k.up ? "up" : (k.enabled ? k.state.toUpperCase() : "disabled"));
      const error = el("td", { class: down ? "ops-bad ops-error" : "ops-error" }, down || !k.up ? (k.last_error || "") : "");
      tr.append(el("td", {}, k.name), el("td", {}, `${k.account}@${k.host}:${k.port}${k.tls ? " (SMQPS)" : ""}`), state,
        el("td", { class: "num" }, k.backlog === null ? "–" : k.backlog), el("td", { class: "num" }, k.stored),
        el("td", { class: "num" }, k.dropped),
        el("td", {}, k.last_change ? k.last_change.slice(0, 19).replace("T", " ") : ""), error);
      return tr;
    }) : [(() => { const tr = el("tr"); tr.append(el("td", { colspan: 8 }, "No links.")); return tr; })()];
    fill(document.querySelector("#ops-links tbody"), linkRows);

    document.getElementById("ops-updated").textContent = "updated " + s.generated.slice(11, 19) + " UTC" +
      (s.counters_unavailable ? " (rates unavailable: " + s.counters_unavailable + ")" : "");
    root.dataset.generated = s.generated;
  }

  function republish(smuid) {
    const form = document.getElementById("ops-republish-form");
    form.elements.smuid.value = smuid;
    form.submit();
  }

  async function refresh() {
    try {
      const r = await fetch(root.dataset.jsonUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!r.ok) throw new Error("HTTP " + r.status);
      render(await r.json());
    } catch (e) {
      document.getElementById("ops-updated").textContent = "refresh failed: " + e.message;
    }
  }

  refresh();
  setInterval(refresh, REFRESH_MS);
})();
