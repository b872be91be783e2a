// forge lab: a kernel page's form posts its settings (and an image, as base64) to its data-api route
// (/api/run/<slug>, or /api/found/<run>-<task> for a kernel found by your runs) and shows the answer: numbers as
// text, pictures as <img> from data URIs. Nothing else is fetched.
"use strict";

function show(id, text) { document.getElementById(id).textContent = text; }

function us(v) { return v == null ? "—" : v >= 1000 ? (v / 1000).toFixed(2) + " ms" : v.toFixed(1) + " µs"; }

function readFile(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(new Error("cannot read the file"));
    r.readAsDataURL(file);
  });
}

async function run(form) {
  const body = {};
  for (const el of form.querySelectorAll("input")) {
    if (el.type === "file") {
      if (el.files.length) body.image = await readFile(el.files[0]);
    } else if (el.value !== "") {
      body[el.name] = el.value;
    }
  }
  const err = document.getElementById("error");
  err.hidden = true;
  document.getElementById("busy").hidden = false;
  try {
    const resp = await fetch(form.dataset.api, {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    const data = await resp.json();
    if (!resp.ok) throw new Error(data.error || resp.statusText);
    render(data);
  } catch (e) {
    err.textContent = e.message;
    err.hidden = false;
  } finally {
    document.getElementById("busy").hidden = true;
  }
}

function render(d) {
  show("path", d.path === "forge" ? "forge-generated kernel (sandboxed worker)" : "vendor / eager (no forge kernel)");
  show("max-error", d.max_error == null ? "—" : d.max_error.toExponential(2) +
       (d.path === "forge" ? " vs eager" : " vs float64"));
  show("time", us(d.us));
  show("eager-time", us(d.eager_us));
  show("speedup", d.speedup == null ? "—" : d.speedup.toFixed(2) + "x");
  show("knobs", d.knobs ? d.knobs + (d.tried > 1 ? " (the fastest verified of " + d.tried + " judged)" : "") : "—");
  show("shapes", d.shapes.map(s => "(" + s.join(", ") + ")").join(" "));
  show("why", d.why);
  show("kernel-source", d.kernel_source || "(eager PyTorch)");
  show("task-source", d.task_source || "(no single task)");
  const pics = document.getElementById("pictures");
  pics.replaceChildren();
  for (const p of d.pictures) {
    const fig = document.createElement("figure");
    const img = document.createElement("img");
    img.src = p.uri;
    img.alt = p.title;
    const cap = document.createElement("figcaption");
    cap.textContent = p.title;
    fig.append(img, cap);
    pics.append(fig);
  }
  document.getElementById("result").hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("run-form");
  if (form) form.addEventListener("submit", ev => { ev.preventDefault(); run(form); });
});
