// The microgpt tab: every head's attention on a typed input, for each run side by side.
//
// TensorBoard imports this module into data/plugin_entry.html?name=microgpt (an iframe whose
// base is data/plugin/microgpt/) and calls render(). Data comes from the plugin's routes,
// "runs" and "attention" (microgpt/commands/tab/tab.py). Plain JavaScript, no build step.
//
// The page reads its state from its URL, after "?" or "#", so a link (or a test) can set it:
//   input=emma          the input (else the last one typed here, else the first run's example)
//   runs=heads=1,heads=4  the runs shown (else all)
//   checkpoint=step-000500.pt  the checkpoint of each run that has it (else its default)
//   q=2                 the character whose attention is pinned (0 = the first character)
// Hovering a character (a row or column label, or a cell) highlights where every head looks
// from it; a click pins it.

const STORE = "microgpt.input";
const state = { runs: [], shown: new Set(), input: "", checkpoint: {}, pinned: null };
let panels = null;
let timer = null;

export async function render() {
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = "style.css";
  document.head.appendChild(link);
  const params = readParams();
  const root = el("div", "mg");
  document.body.appendChild(root);
  let listing;
  try {
    listing = await getJson("runs");
  } catch (err) {
    root.appendChild(el("p", "mg-error", `cannot list the runs: ${err.message}`));
    return;
  }
  state.runs = listing.runs;
  if (!state.runs.length) {
    root.appendChild(el("p", "mg-error", "no microgpt runs under this log directory"));
    return;
  }
  const wanted = params.get("runs");
  const names = state.runs.map((r) => r.name);
  state.shown = new Set(wanted ? wanted.split(",").filter((n) => names.includes(n)) : names);
  for (const run of state.runs) {
    const asked = params.get("checkpoint");
    state.checkpoint[run.name] = run.checkpoints.includes(asked) ? asked : run.checkpoints[0];
  }
  state.input = params.get("input") ?? localStorage.getItem(STORE) ?? listing.example ?? "";
  const q = parseInt(params.get("q"), 10);
  state.pinned = Number.isNaN(q) ? null : q;
  root.appendChild(controls());
  panels = el("div", "mg-panels");
  root.appendChild(panels);
  await refresh();
}

function readParams() {
  const out = new URLSearchParams(location.search);
  for (const [k, v] of new URLSearchParams(location.hash.slice(1))) out.set(k, v);
  return out;
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

async function getJson(url) {
  const response = await fetch(url);
  let body;
  try {
    body = await response.json();
  } catch (err) {
    throw new Error(`${response.status} ${response.statusText}`);
  }
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

// ------------------------------------------------------------------------------ the controls

function controls() {
  const bar = el("div", "mg-controls");
  const label = el("label", "mg-input-label", "input ");
  // a text area keeps the line ends a text run reads (an <input> drops them)
  const input = el("textarea", "mg-input");
  input.spellcheck = false;
  input.value = state.input;
  input.rows = Math.min(4, state.input.split("\n").length);
  input.placeholder = "a name, or a line of text";
  input.addEventListener("input", () => {
    state.input = input.value;
    input.rows = Math.min(4, input.value.split("\n").length);
    clearTimeout(timer);
    timer = setTimeout(refresh, 200);
  });
  label.appendChild(input);
  bar.appendChild(label);
  const picker = el("span", "mg-run-picker", "runs ");
  for (const run of state.runs) {
    const box = el("input");
    box.type = "checkbox";
    box.checked = state.shown.has(run.name);
    box.addEventListener("change", () => {
      box.checked ? state.shown.add(run.name) : state.shown.delete(run.name);
      refresh();
    });
    const item = el("label", "mg-run-choice");
    item.append(box, run.name);
    picker.appendChild(item);
  }
  bar.appendChild(picker);
  bar.appendChild(
    el(
      "span",
      "mg-hint",
      "each head: its role and score · the loss rise (nats) when it is zeroed. " +
        "Hover a character to see where each head looks from it; click to pin."
    )
  );
  return bar;
}

function saveState() {
  localStorage.setItem(STORE, state.input);
  const params = new URLSearchParams();
  params.set("input", state.input);
  if (state.shown.size !== state.runs.length) params.set("runs", [...state.shown].join(","));
  if (state.pinned !== null) params.set("q", state.pinned);
  history.replaceState(null, "", `#${params}`);
}

// ------------------------------------------------------------------------------ the panels

async function refresh() {
  saveState();
  panels.replaceChildren();
  const shown = state.runs.filter((run) => state.shown.has(run.name));
  await Promise.all(shown.map((run) => fillPanel(run, panels.appendChild(emptyPanel(run)))));
  showQuery(state.pinned);
}

function emptyPanel(run) {
  const panel = el("section", "mg-panel");
  panel.dataset.run = run.name;
  const header = el("header", "mg-panel-header");
  header.appendChild(el("h2", "mg-run-name", run.name));
  if (run.checkpoints.length > 1) {
    const select = el("select", "mg-checkpoint");
    for (const name of run.checkpoints) {
      const option = el("option", null, name);
      option.value = name;
      option.selected = name === state.checkpoint[run.name];
      select.appendChild(option);
    }
    select.addEventListener("change", async () => {
      state.checkpoint[run.name] = select.value;
      await fillPanel(run, panel);
      showQuery(state.pinned);
    });
    header.appendChild(select);
  } else if (run.checkpoints.length === 1) {
    header.appendChild(el("span", "mg-checkpoint-name", run.checkpoints[0]));
  }
  header.appendChild(el("span", "mg-meta"));
  panel.appendChild(header);
  panel.appendChild(el("div", "mg-body", "loading..."));
  return panel;
}

async function fillPanel(run, panel) {
  const body = panel.querySelector(".mg-body");
  const ticket = (panel.ticket = (panel.ticket || 0) + 1);
  const query = new URLSearchParams({ run: run.name, input: state.input });
  if (state.checkpoint[run.name]) query.set("checkpoint", state.checkpoint[run.name]);
  let result;
  try {
    result = await getJson(`attention?${query}`);
  } catch (err) {
    if (ticket !== panel.ticket) return;
    panel.querySelector(".mg-meta").textContent = "";
    body.replaceChildren(el("p", "mg-error", err.message));
    return;
  }
  if (ticket !== panel.ticket) return;
  const analysis = result.analysis || "not analysed";
  panel.querySelector(".mg-meta").textContent = `step ${result.step} · ${analysis}`;
  panel.dataset.heads = result.n_head;
  body.replaceChildren(...result.layers.map((heads, layer) => layerRow(result, heads, layer)));
}

function layerRow(result, heads, layer) {
  const row = el("div", "mg-layer");
  row.appendChild(el("div", "mg-layer-name", `layer ${layer}`));
  const maps = el("div", "mg-heads");
  heads.forEach((weights, head) => {
    maps.appendChild(headFigure(result, weights, layer, head));
  });
  row.appendChild(maps);
  return row;
}

// ------------------------------------------------------------------------------ one head

function headFigure(result, weights, layer, head) {
  const figure = el("figure", "mg-head");
  figure.dataset.layer = layer;
  figure.dataset.head = head;
  const caption = el("figcaption", "mg-caption");
  caption.appendChild(el("div", "mg-head-name", `L${layer} H${head}`));
  caption.appendChild(headLabel(result.heads[layer][head]));
  figure.appendChild(caption);
  const map = figure.appendChild(heatmap(result, weights));
  figure.style.width = `${Math.max(72, (result.tokens.length + 1) * map.cell)}px`;
  figure.appendChild(el("div", "mg-looks", "\u00a0"));
  return figure;
}

function headLabel(label) {
  if (!label) return el("div", "mg-role mg-unanalysed", "not analysed");
  const box = el("div", "mg-role");
  box.appendChild(el("span", "mg-role-name", label.role));
  const score = label.score == null ? "" : label.score.toFixed(2);
  const rise = label.importance == null ? "" : ` · ${signed(label.importance)}`;
  box.appendChild(el("span", "mg-role-numbers", score + rise));
  box.title = "role, its score (attention mass on the role's pattern) · importance (loss rise in nats when the head is zeroed)";
  return box;
}

function signed(x) {
  return (x >= 0 ? "+" : "") + x.toFixed(2);
}

// Token t of a names run is character t - 1 (token 0 is the boundary, character -1); a text run
// has no boundary token. Highlights go by character, so that both kinds of run line up.
function charOf(result, token) {
  return result.boundary ? token - 1 : token;
}

// A head's map: the key characters across the top, the query characters down the side (labels
// in the DOM), the weights drawn on a canvas (so that a long input stays quick to draw).
function heatmap(result, weights) {
  const T = result.tokens.length;
  const cell = cellSize(T);
  const map = el("div", "mg-map");
  map.style.setProperty("--cell", `${cell}px`);
  map.style.gridTemplateColumns = `repeat(${T + 1}, ${cell}px)`;
  Object.assign(map, { weights, tokens: result.tokens, cell, query: -1 });
  map.chars = result.tokens.map((_, t) => charOf(result, t));
  map.appendChild(el("span", "mg-corner"));
  result.tokens.forEach((token, k) => map.appendChild(labelCell(map, token, "mg-key", k)));
  result.tokens.forEach((token, q) => map.appendChild(labelCell(map, token, "mg-query", q)));
  const canvas = el("canvas", "mg-cells");
  const ratio = window.devicePixelRatio || 1;
  canvas.width = canvas.height = Math.ceil(T * cell * ratio);
  canvas.style.width = canvas.style.height = `${T * cell}px`;
  canvas.style.gridArea = `2 / 2 / span ${T} / span ${T}`;
  map.appendChild(canvas);
  map.canvas = canvas;
  draw(map);
  canvas.addEventListener("mousemove", (event) => {
    const q = Math.min(T - 1, Math.floor(event.offsetY / cell));
    const k = Math.min(T - 1, Math.floor(event.offsetX / cell));
    canvas.title = `${result.tokens[q]} → ${result.tokens[k]}: ${weights[q][k].toFixed(3)}`;
    if (q !== map.query) showQuery(map.chars[q]);
  });
  map.addEventListener("mouseover", (event) => {
    const label = event.target.closest(".mg-label");
    if (label) showQuery(parseInt(label.dataset.char, 10));
  });
  map.addEventListener("mouseleave", () => showQuery(state.pinned));
  map.addEventListener("click", () => {
    const c = map.query >= 0 ? map.chars[map.query] : null;
    state.pinned = state.pinned === c ? null : c;
    saveState();
    showQuery(state.pinned);
  });
  return map;
}

function labelCell(map, token, cls, t) {
  const label = el("span", `mg-label ${cls}`, token);
  label.dataset.char = map.chars[t];
  if (token.length > 1) label.classList.add("mg-long");
  label.style.gridRow = cls === "mg-key" ? 1 : t + 2;
  label.style.gridColumn = cls === "mg-key" ? t + 2 : 1;
  return label;
}

function cellSize(T) {
  return T <= 10 ? 12 : Math.max(7, Math.floor(130 / T));
}

// The weights, query rows other than map.query dimmed while one is chosen.
function draw(map) {
  const { weights, cell, query } = map;
  const ctx = map.canvas.getContext("2d");
  const ratio = map.canvas.width / (weights.length * cell);
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, weights.length * cell, weights.length * cell);
  const gap = cell >= 8 ? 1 : 0;
  weights.forEach((row, q) => {
    const dim = query >= 0 && q !== query ? 0.2 : 1;
    row.forEach((w, k) => {
      ctx.fillStyle = k <= q ? `rgba(25, 118, 210, ${dim * (0.04 + 0.96 * w)})` : "#fafafa";
      ctx.fillRect(k * cell, q * cell, cell - gap, cell - gap);
    });
  });
  if (query >= 0) {
    ctx.strokeStyle = "#ff9800";
    ctx.strokeRect(0.5, query * cell + 0.5, (query + 1) * cell - 1, cell - 1);
  }
}

// Highlight, in every map of every run, the row of character c (-1: the boundary token), and
// color the key labels by where that row looks; null clears it.
function showQuery(c) {
  for (const map of document.querySelectorAll(".mg-map")) {
    const q = c === null ? -1 : map.chars.indexOf(c);
    map.query = q;
    map.classList.toggle("mg-focus", q >= 0);
    map.querySelectorAll(".mg-query").forEach((label, i) => label.classList.toggle("mg-on", i === q));
    map.querySelectorAll(".mg-key").forEach((label, k) => {
      const w = q >= 0 && k <= q ? map.weights[q][k] : 0;
      label.style.background = w > 0 ? `rgba(255, 152, 0, ${w})` : "";
    });
    map.parentElement.querySelector(".mg-looks").textContent = q >= 0 ? looksAt(map, q) : "\u00a0";
    draw(map);
  }
}

function looksAt(map, q) {
  const row = map.weights[q].slice(0, q + 1);
  const k = row.indexOf(Math.max(...row));
  return `${map.tokens[q]}→${map.tokens[k]} ${row[k].toFixed(2)}`;
}
