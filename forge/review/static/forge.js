// forge ui: live refresh of pages of a running run, and the interactive search tree of a task page.
// Talks to this app only. Store text is set with textContent; HTML fragments come escaped from the server.
"use strict";

(function () {
  const POLL_MS = 2000;
  const SVGNS = "http://www.w3.org/2000/svg";
  const body = document.body;
  const live = document.getElementById("live");

  async function fetchOk(url) {
    const r = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!r.ok) throw new Error(url + ": HTTP " + r.status);
    return r;
  }
  const getJSON = async (url) => (await fetchOk(url)).json();
  const getText = async (url) => (await fetchOk(url)).text();

  function setLive(on) {
    if (live) live.textContent = on ? "running: updating live" : "";
  }

  // Run list and run page: poll the version; when it changes, swap in the server-rendered fragment.
  function pollFragment() {
    let version = body.dataset.version;
    const content = document.getElementById("content");
    async function tick() {
      let running = true;
      try {
        const v = await getJSON(body.dataset.poll);
        running = v.running === true || v.state === "running";
        if (v.version !== version) {
          content.innerHTML = await getText(body.dataset.fragment);
          version = v.version;
        }
      } catch (e) {
        console.warn("forge ui:", e);
      }
      setLive(running);
      if (running) setTimeout(tick, POLL_MS);
    }
    setLive(true);
    setTimeout(tick, POLL_MS);
  }

  // Task page: the tree, left to right (depth across, one row per leaf), nodes clickable.
  function layout(nodes) {
    const kids = new Map();
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const roots = [];
    for (const n of nodes) {
      if (n.parent_id !== null && byId.has(n.parent_id)) {
        if (!kids.has(n.parent_id)) kids.set(n.parent_id, []);
        kids.get(n.parent_id).push(n);
      } else roots.push(n);
    }
    const pos = new Map();
    let row = 0;
    function place(n, depth) {
      const cs = kids.get(n.id) || [];
      if (!cs.length) pos.set(n.id, { x: depth, y: row++ });
      else {
        cs.forEach((c) => place(c, depth + 1));
        pos.set(n.id, { x: depth, y: (pos.get(cs[0].id).y + pos.get(cs[cs.length - 1].id).y) / 2 });
      }
    }
    roots.forEach((r) => place(r, 0));
    return { pos, rows: row };
  }

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVGNS, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (parent) parent.appendChild(e);
    return e;
  }

  function colour(n) {
    if (n.baseline) return "#bab0ac";
    if (n.failed) return "#e45756";
    if (n.status === "ok") return "#54a24b";
    return "#eeca3b"; // pending / building
  }

  // a speedup with its interval, "~" when its timing is noisy (forge.confidence.fmt)
  function fmtSpeedup(x, ci, noisy) {
    if (x === null || x === undefined) return "-";
    const interval = ci ? " [" + ci[0].toFixed(2) + "-" + ci[1].toFixed(2) + "]" : "";
    return x.toFixed(2) + "x" + interval + (noisy ? " ~" : "");
  }

  const KNOBS_MAX = 40; // characters of knobs on a label; the tooltip has them all

  function label(n) {
    if (n.baseline) return "#" + n.id + " eager";
    const head = "#" + n.id + " " + (n.speedup !== null ? n.speedup.toFixed(2) + "x" + (n.noisy ? " ~" : "") : n.status);
    if (!n.knobs) return head;
    return head + "  " + (n.knobs.length > KNOBS_MAX ? n.knobs.slice(0, KNOBS_MAX - 1) + "\u2026" : n.knobs);
  }

  function tooltip(n) {
    const lines = ["node #" + n.id + " (" + n.origin + "): " + n.status, "visits " + n.visits];
    if (n.speedup !== null) lines.push("speedup " + fmtSpeedup(n.speedup, n.speedup_ci, n.noisy) +
      (n.noisy ? " (noisy timing)" : ""));
    if (n.knobs) lines.push(n.knobs);
    if (n.reason) lines.push(n.reason);
    return lines.join("\n");
  }

  let selected = null;

  async function select(id) {
    const panel = document.getElementById("panel");
    try {
      panel.innerHTML = await getText("/fragments/nodes/" + encodeURIComponent(id)); // escaped by the server
    } catch (e) {
      panel.textContent = String(e);
      return;
    }
    selected = id;
    document.querySelectorAll("#tree .node").forEach((g) => g.classList.toggle("selected", g.dataset.id === String(id)));
    markRow();
    history.replaceState(null, "", "#node-" + id);
  }

  // the node table's row of the selected node
  function markRow() {
    document.querySelectorAll("table.nodes tbody tr").forEach((tr) =>
      tr.classList.toggle("selected", tr.dataset.id === String(selected)));
  }

  function drawTree(data) {
    const box = document.getElementById("tree");
    const { pos, rows } = layout(data.nodes);
    const longest = Math.max(8, ...data.nodes.map((n) => label(n).length));
    const LABEL = 20 + 6.5 * longest; // about 6.5 px a character at 12 px
    const DX = Math.max(120, LABEL + 24), DY = 28, PAD = 16;
    const depth = Math.max(0, ...data.nodes.map((n) => pos.get(n.id).x));
    const svg = el("svg", { width: PAD * 2 + depth * DX + LABEL, height: PAD * 2 + Math.max(rows - 1, 0) * DY + 10,
                            "font-family": "system-ui, sans-serif", "font-size": 12, role: "tree" });
    const xy = (id) => [PAD + 8 + pos.get(id).x * DX, PAD + pos.get(id).y * DY];
    for (const n of data.nodes) {
      if (n.parent_id === null || !pos.has(n.parent_id)) continue;
      const [x1, y1] = xy(n.parent_id), [x2, y2] = xy(n.id);
      const mid = (x1 + x2) / 2;
      el("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, fill: "none", stroke: "#bbb" }, svg);
    }
    for (const n of data.nodes) {
      const [x, y] = xy(n.id);
      const g = el("g", { class: "node", "data-id": n.id, tabindex: 0, role: "treeitem" }, svg);
      g.dataset.id = String(n.id);
      el("title", {}, g).textContent = tooltip(n);
      el("circle", { cx: x, cy: y, r: 7, fill: colour(n), stroke: n.best ? "#c9a100" : "#555",
                     "stroke-width": n.best ? 3 : 1 }, g);
      const t = el("text", { x: x + 11, y: y + 4 }, g);
      t.textContent = label(n);
      if (n.best) t.setAttribute("font-weight", "bold");
      g.addEventListener("click", () => select(n.id));
      g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") select(n.id); });
      if (n.id === selected) g.classList.add("selected");
    }
    box.replaceChildren(svg);
    const s = document.getElementById("task-summary");
    const t = data.task;
    if (s) s.textContent = `${t.family}: ${t.tried} candidates tried, ${t.failed} failed; best ` +
      fmtSpeedup(t.speedup, t.speedup_ci, t.noisy) + (t.verdict ? ", " + t.verdict : "") + `; ${t.state}` + (t.stop_reason ? ": " + t.stop_reason : "");
  }

  async function treePage() {
    let version = null;
    async function tick(first) {
      let running = body.dataset.running === "1";
      try {
        const data = await getJSON(body.dataset.tree);
        running = data.run_state === "running";
        if (data.version !== version) {
          version = data.version;
          drawTree(data);
          const content = document.getElementById("content");
          if (content && body.dataset.nodes) content.innerHTML = await getText(body.dataset.nodes); // escaped
        }
        if (first) {
          const m = /^#node-(\d+)$/.exec(location.hash);
          if (m) await select(Number(m[1]));
        }
      } catch (e) {
        console.warn("forge ui:", e);
      }
      setLive(running);
      if (running) setTimeout(() => tick(false), POLL_MS);
    }
    await tick(true);
  }

  // Tables with class "sortable": a click on a header sorts by that column (numbers as numbers, "-" last; a
  // cell's data-sort, where it has one, is its value). The last sort is kept when live refresh replaces a table.
  function cellValue(row, i) {
    const cell = row.cells[i];
    const text = (cell ? (cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent) : "").trim();
    const num = parseFloat(text.replace(/^\$/, "").replace(/,/g, ""));
    return { text, num: /^[-$]?\d/.test(text) && !Number.isNaN(num) ? num : null };
  }

  const lastSort = new Map(); // table class -> { i, desc }

  function sortBy(table, th) {
    const i = Array.from(th.parentElement.children).indexOf(th);
    applySort(table, i, !th.classList.contains("sorted-desc"));
  }

  function applySort(table, i, desc) {
    const th = table.tHead.rows[0].cells[i];
    if (!th) return;
    lastSort.set(table.className, { i, desc });
    table.querySelectorAll("th").forEach((h) => h.classList.remove("sorted-asc", "sorted-desc"));
    th.classList.add(desc ? "sorted-desc" : "sorted-asc");
    const tbody = table.tBodies[0];
    const rows = Array.from(tbody.rows);
    rows.sort((ra, rb) => {
      const a = cellValue(ra, i), b = cellValue(rb, i);
      if (a.num === null || b.num === null) {
        if (a.num !== b.num) return a.num === null ? 1 : -1; // dashes and text after numbers
        return (desc ? -1 : 1) * a.text.localeCompare(b.text);
      }
      return (desc ? -1 : 1) * (a.num - b.num);
    });
    tbody.replaceChildren(...rows);
  }

  function sortable(root) {
    root.querySelectorAll("table.sortable").forEach((table) => {
      const heads = table.tHead ? table.tHead.rows : [];
      if (heads.length !== 1) return; // two-row headers (the comparison) are not sortable by a click
      Array.from(heads[0].cells).forEach((th) => th.addEventListener("click", () => sortBy(table, th)));
      const last = lastSort.get(table.className);
      if (last) applySort(table, last.i, last.desc);
    });
  }

  // An input#filter with data-table="selector": rows whose text does not contain every word are hidden.
  function applyFilter() {
    const input = document.getElementById("filter");
    if (!input) return;
    const words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    document.querySelectorAll(input.dataset.table + " tbody tr").forEach((tr) => {
      const text = tr.textContent.toLowerCase();
      tr.hidden = !words.every((w) => text.includes(w));
    });
  }

  function tables() {
    sortable(document);
    const input = document.getElementById("filter");
    if (input) input.addEventListener("input", applyFilter);
    const content = document.getElementById("content");
    if (!content) return;
    new MutationObserver(() => { sortable(content); applyFilter(); markRow(); }).observe(content, { childList: true });
    content.addEventListener("click", (ev) => { // the node table: a node's id opens it beside the tree
      const a = ev.target.closest("a.node-link");
      if (!a) return;
      ev.preventDefault();
      select(Number(a.dataset.id));
    });
  }

  tables();
  if (body.dataset.tree) treePage();
  else if (body.dataset.poll && body.dataset.running === "1") pollFragment();
})();
