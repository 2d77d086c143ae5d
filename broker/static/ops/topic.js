// A topic's console page: its rate chart, and its depth refreshed every REFRESH_MS.
(function () {
  "use strict";
  const REFRESH_MS = 3000;
  const root = document.getElementById("ops-topic");
  if (!root) return;
  let chart = null;

  function draw(rates) {
    // The last minute is not over: the line stops before it, the caption tells it so far.
    const n = rates.publish.length - 1;
    const caption = document.getElementById("ops-topic-rates-sofar");
    if (caption) {
      caption.textContent = `this minute so far: ${rates.publish[n]} published, ${rates.ack[n]} ACKed`;
      caption.dataset.publish = rates.publish[n];
      caption.dataset.ack = rates.ack[n];
    }
    rates = { start: rates.start, publish: rates.publish.slice(0, n), ack: rates.ack.slice(0, n) };
    const start = Date.parse(rates.start);
    const data = {
      labels: rates.publish.map((_, i) => new Date(start + i * 60000).toISOString().slice(11, 16)),
      datasets: [
        { label: "publish", data: rates.publish, borderColor: "#417690", backgroundColor: "#417690", pointRadius: 0 },
        { label: "ack", data: rates.ack, borderColor: "#2a9a4a", backgroundColor: "#2a9a4a", pointRadius: 0 },
      ],
    };
    if (chart) { chart.data = data; chart.update("none"); return; }
    if (typeof Chart === "undefined") return;
    chart = new Chart(document.getElementById("ops-topic-rates"), {
      type: "line", data: data,
      options: { animation: false, scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }

  async function refresh() {
    try {
      const r = await fetch(root.dataset.jsonUrl, { credentials: "same-origin" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const d = await r.json();
      for (const f of ["messages", "pending", "locked", "dead"]) {
        root.querySelector(`#ops-topic-depth [data-field="${f}"]`).textContent = d.depth[f];
      }
      root.querySelector('#ops-topic-depth [data-field="trash"]').textContent = d.trash;
      draw(d.rates);
      root.dataset.generated = new Date().toISOString();
    } catch (e) {
      document.getElementById("ops-updated").textContent = "refresh failed: " + e.message;
    }
  }

  draw(JSON.parse(document.getElementById("ops-topic-initial").textContent));
  setInterval(refresh, REFRESH_MS);
})();
