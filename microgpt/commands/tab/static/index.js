// The microgpt tab, a head lab: every head's attention on a typed input for each run side by side,
// what each run predicts at each character, heads switched off, what each head adds to the next
// character (direct logit attribution), and a slider over a run's step checkpoints.
//
// TensorBoard imports this module into data/plugin_entry.html?name=microgpt (an iframe whose
// base is data/plugin/microgpt/) and calls render(). Data comes from the plugin's routes, "runs",
// "attention" and "timeline" (microgpt/commands/tab/tab.py): one request per run per interaction,
// and a run's maps are drawn again only when they change. Plain JavaScript, no build step.
//
// Runs that differ only by seed form a group ("groups" of /runs): one panel per group, showing
// one of its runs at a time (its seed buttons switch), each head's role with the number of the
// group's analysed seeds that have it.
//
// The page keeps its state in the address bar: TensorBoard's, after "#microgpt&", and its own
// URL's, after "?" or "#" (the page alone, or a test), so a view can be linked and reloaded:
//   input=emma          the input (else the last one typed here, else the first run's example)
//   runs=heads=1,heads=4  the groups shown (else all); a run's name shows its group at that run
//   seed:GROUP=2        the seed a group shows (else its first)
//   checkpoint=step-000500.pt  the checkpoint of each run that has it (else its default)
//   checkpoint:RUN=...  one run's checkpoint (its step);  off:RUN=0.1,1.3  its heads off (L.H)
//   ablation=mean       what a head switched off outputs: zero (the default) or its mean
//   q=2                 the pinned character (0 = the first; -1 the boundary <s>): its attention
//                       is highlighted and its next character's logit attributed (else none)
//   sort=size           the attribution's parts by size (else in layer order)
// Hovering a character highlights where every head looks from it; a click pins it. A click on a
// head's name switches it off (or on again); its ⤢ opens it large.

const STORE = "microgpt.input";
const state = {
  runs: [],
  groups: [], // {name, runs, seeds}: runs[i] trained with seeds[i]
  shown: new Set(), // group names
  seed: {}, // group -> the run it shows
  input: "",
  checkpoint: {}, // run -> checkpoint name
  off: {}, // run -> Set of "L.H"
  ablation: "zero",
  pinned: null, // a character index, or null: none
  sort: "layer",
};
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
  state.groups = listing.groups;
  // names joined by commas (a sweep's run names hold commas too: "heads=4,seed=2")
  const wanted = params.get("runs");
  const listed = (name) => `,${wanted},`.includes(`,${name},`);
  for (const group of state.groups) {
    const asked = group.runs[group.seeds.indexOf(parseInt(params.get(`seed:${group.name}`), 10))];
    const named = group.runs.find(listed); // a run's name: its group at that seed
    state.seed[group.name] = named || asked || group.runs[0];
    if (wanted === null || named || listed(group.name)) state.shown.add(group.name);
  }
  for (const run of state.runs) {
    const asked = params.get(`checkpoint:${run.name}`) ?? params.get("checkpoint");
    state.checkpoint[run.name] = run.checkpoints.includes(asked) ? asked : run.checkpoints[0];
    state.off[run.name] = new Set((params.get(`off:${run.name}`) || "").split(",").filter(Boolean));
  }
  state.input = params.get("input") ?? localStorage.getItem(STORE) ?? listing.example ?? "";
  state.ablation = params.get("ablation") === "mean" ? "mean" : "zero";
  state.sort = params.get("sort") === "size" ? "size" : "layer";
  const q = parseInt(params.get("q"), 10);
  state.pinned = Number.isNaN(q) ? null : q;
  root.appendChild(controls());
  panels = el("div", "mg-panels");
  root.appendChild(panels);
  document.addEventListener("keydown", (event) => event.key === "Escape" && closeLarge());
  await refresh();
}

function readParams() {
  const out = new URLSearchParams(location.search);
  for (const [k, v] of new URLSearchParams(location.hash.slice(1))) out.set(k, v);
  const top = topHash();
  if (top !== null) for (const [k, v] of new URLSearchParams(top)) out.set(k, v);
  return out;
}

// TensorBoard's address bar after "#microgpt&" (its tab), where the page keeps its state; null
// outside TensorBoard (the page alone) or on another tab.
const TAB = "#microgpt";
function topHash() {
  try {
    if (window.parent === window) return null;
    const hash = window.parent.location.hash;
    return hash === TAB || hash.startsWith(`${TAB}&`) ? hash.slice(TAB.length + 1) : null;
  } catch (err) {
    return null; // another origin
  }
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

function signed(x, digits = 2) {
  return (x >= 0 ? "+" : "") + x.toFixed(digits);
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
  for (const group of state.groups) {
    const box = el("input");
    box.type = "checkbox";
    box.checked = state.shown.has(group.name);
    box.addEventListener("change", () => {
      box.checked ? state.shown.add(group.name) : state.shown.delete(group.name);
      refresh();
    });
    const item = el("label", "mg-run-choice");
    const seeds = group.runs.length > 1 ? ` (${group.runs.length} seeds)` : "";
    item.append(box, group.name + seeds);
    picker.appendChild(item);
  }
  bar.appendChild(picker);
  const ablation = el("select", "mg-ablation");
  for (const [value, text] of [["zero", "switched off: zero"], ["mean", "switched off: mean"]]) {
    const option = el("option", null, text);
    option.value = value;
    option.selected = value === state.ablation;
    ablation.appendChild(option);
  }
  ablation.title = "what a head switched off outputs: zero, or its mean over the validation split";
  ablation.addEventListener("change", () => {
    state.ablation = ablation.value;
    refresh((run) => state.off[run.name].size > 0);
  });
  const reset = el("button", "mg-reset", "all heads on");
  reset.addEventListener("click", () => {
    const had = new Set(state.runs.filter((run) => state.off[run.name].size).map((r) => r.name));
    for (const run of state.runs) state.off[run.name].clear();
    refresh((run) => had.has(run.name));
  });
  bar.append(ablation, reset);
  bar.appendChild(
    el(
      "span",
      "mg-hint",
      "each head: its role and its analysis' measures (hover them) · " +
        "click its name to switch it off: its " +
        "loss change on the input (input ±nats) · hover a character to see where each head " +
        "looks from it; click to pin it and see what each head adds to the next character"
    )
  );
  return bar;
}

function saveState() {
  localStorage.setItem(STORE, state.input);
  const params = new URLSearchParams();
  params.set("input", state.input);
  if (state.shown.size !== state.groups.length) params.set("runs", [...state.shown].join(","));
  for (const group of state.groups) {
    const seed = group.seeds[group.runs.indexOf(state.seed[group.name])];
    if (state.seed[group.name] !== group.runs[0]) params.set(`seed:${group.name}`, seed);
  }
  for (const run of state.runs) {
    const checkpoint = state.checkpoint[run.name];
    if (checkpoint !== run.checkpoints[0]) params.set(`checkpoint:${run.name}`, checkpoint);
    if (state.off[run.name].size) params.set(`off:${run.name}`, [...state.off[run.name]].join());
  }
  if (state.ablation !== "zero") params.set("ablation", state.ablation);
  if (state.pinned !== null) params.set("q", state.pinned);
  if (state.sort !== "layer") params.set("sort", state.sort);
  history.replaceState(null, "", `#${params}`);
  if (topHash() !== null) window.parent.history.replaceState(null, "", `${TAB}&${params}`);
}

// ------------------------------------------------------------------------------ the panels

// Ask again for the runs shown that `which` picks (all of them by default); the panels of runs
// shown that are not there yet are made, those of runs hidden removed.
async function refresh(which = () => true) {
  saveState();
  const chosen = state.groups.filter((g) => state.shown.has(g.name)).map((g) => state.seed[g.name]);
  const shown = chosen.map((name) => state.runs.find((run) => run.name === name));
  const have = new Map([...panels.children].map((panel) => [panel.dataset.run, panel]));
  const order = shown.map((run) => have.get(run.name) || emptyPanel(run));
  panels.replaceChildren(...order);
  const asked = shown.filter((run, i) => !have.has(run.name) || which(run, order[i]));
  await Promise.all(asked.map((run) => fillPanel(run, order[shown.indexOf(run)])));
}

function emptyPanel(run) {
  const panel = el("section", "mg-panel");
  panel.dataset.run = run.name;
  const header = el("header", "mg-panel-header");
  const group = state.groups.find((g) => g.runs.includes(run.name));
  header.appendChild(el("h2", "mg-run-name", group.runs.length > 1 ? group.name : run.name));
  if (group.runs.length > 1) header.appendChild(seedButtons(group, run));
  const choose = (name) => {
    state.checkpoint[run.name] = name;
    saveState();
    fillPanel(run, panel);
  };
  if (run.checkpoints.length > 1) {
    const select = el("select", "mg-checkpoint");
    for (const name of run.checkpoints) {
      const option = el("option", null, name);
      option.value = name;
      select.appendChild(option);
    }
    select.addEventListener("change", () => choose(select.value));
    header.appendChild(select);
  } else if (run.checkpoints.length === 1) {
    header.appendChild(el("span", "mg-checkpoint-name", run.checkpoints[0]));
  }
  panel.append(header, el("div", "mg-meta"));
  const steps = stepCheckpoints(run);
  if (steps.length > 1) panel.appendChild(slider(run, steps, choose));
  panel.appendChild(el("div", "mg-loss"));
  panel.appendChild(el("div", "mg-body", "loading..."));
  return panel;
}

// A group's seeds, one button each: a click shows that seed's run in the group's panel.
function seedButtons(group, run) {
  const box = el("span", "mg-seeds", "seed ");
  box.title = "the group's runs differ only by their seed";
  group.runs.forEach((name, i) => {
    const button = el("button", "mg-seed", String(group.seeds[i]));
    button.title = name;
    button.dataset.run = name;
    button.classList.toggle("mg-chosen", name === run.name);
    button.addEventListener("click", () => {
      state.seed[group.name] = name;
      refresh();
    });
    box.appendChild(button);
  });
  return box;
}

// The run's step-N.pt checkpoints in step order: [[name, step], ...] ("snapshots" of /runs).
function stepCheckpoints(run) {
  return run.snapshots || [];
}

// A slider over the step checkpoints, and beside it the run's validation loss and its heads'
// scores over training (/timeline), the step shown marked.
function slider(run, steps, choose) {
  const box = el("div", "mg-steps");
  const range = el("input", "mg-slider");
  Object.assign(range, { type: "range", min: 0, max: steps.length - 1, step: 1 });
  range.title = "the run's step checkpoints (train.save_every)";
  let wait = null;
  range.addEventListener("input", () => {
    clearTimeout(wait);
    wait = setTimeout(() => choose(steps[range.value][0]), 60);
  });
  box.append(range, el("span", "mg-slider-step"), el("div", "mg-timeline"));
  getJson(`timeline?${new URLSearchParams({ run: run.name })}`)
    .then((timeline) => drawTimeline(box.querySelector(".mg-timeline"), timeline, choose))
    .catch((err) => box.querySelector(".mg-timeline").append(el("span", "mg-error", err.message)));
  return box;
}

function panelQuery(run, panel) {
  const query = new URLSearchParams({ run: run.name, input: state.input });
  if (state.checkpoint[run.name]) query.set("checkpoint", state.checkpoint[run.name]);
  if (state.off[run.name].size) {
    query.set("off", [...state.off[run.name]].join());
    query.set("ablation", state.ablation);
  }
  // the pinned character's token: one more where the run's tokens start with the boundary
  const first = panel.result ? (panel.result.boundary ? 1 : 0) : 1;
  const pin = state.pinned === null ? null : state.pinned + first;
  if (pin !== null && pin >= 0 && pin < Array.from(state.input).length + first) {
    query.set("pin", pin);
  }
  return query;
}

async function fillPanel(run, panel) {
  const body = panel.querySelector(".mg-body");
  const ticket = (panel.ticket = (panel.ticket || 0) + 1);
  let result;
  try {
    result = await getJson(`attention?${panelQuery(run, panel)}`);
  } catch (err) {
    if (ticket !== panel.ticket) return;
    panel.querySelector(".mg-meta").textContent = "";
    panel.querySelector(".mg-loss").textContent = "";
    body.replaceChildren(el("p", "mg-error", err.message));
    panel.mapsKey = null;
    return;
  }
  if (ticket !== panel.ticket) return;
  const guessed = panel.result === undefined && state.pinned !== null && !result.boundary;
  panel.result = result;
  if (guessed) return fillPanel(run, panel); // a text run: its pin counted without a boundary
  showResult(run, panel, result);
}

function showResult(run, panel, result) {
  const select = panel.querySelector(".mg-checkpoint");
  if (select) select.value = result.checkpoint;
  const steps = stepCheckpoints(run);
  const range = panel.querySelector(".mg-slider");
  if (range) {
    const at = steps.findIndex(([name]) => name === result.checkpoint);
    if (at >= 0) range.value = at;
    range.classList.toggle("mg-away", at < 0);
    panel.querySelector(".mg-slider-step").textContent = `step ${result.step}`;
  }
  panel.querySelectorAll(".mg-now").forEach((line) => placeNow(line, result.step));
  const analysis = result.analysis || "not analysed";
  const name = result.group.runs.length > 1 ? `${result.run} · ` : "";
  panel.querySelector(".mg-meta").textContent = `${name}step ${result.step} · ${analysis}`;
  panel.dataset.heads = result.n_head;
  showLoss(panel.querySelector(".mg-loss"), result);
  // the maps, the predictions and the heads' labels change with these alone, not with the pin
  const key = JSON.stringify([result.checkpoint, result.step, result.tokens, result.off,
    result.ablation]); // prettier-ignore
  const body = panel.querySelector(".mg-body");
  if (panel.mapsKey !== key) {
    panel.mapsKey = key;
    const T = result.tokens.length;
    const layers = result.layers.map((heads, layer) =>
      layerRow(run, result, heads.map((sent) => weightsOf(sent, T)), layer),
    );
    const side = el("div", "mg-side");
    side.append(predictions(result), el("div", "mg-attribution"));
    const maps = el("div", "mg-maps");
    maps.append(...layers);
    body.replaceChildren(maps, side);
  }
  for (const figure of body.querySelectorAll(".mg-head")) updateHead(figure, result);
  body.querySelectorAll(".mg-position").forEach((column) => {
    column.classList.toggle("mg-pinned", +column.dataset.position === result.pin);
  });
  body.querySelector(".mg-attribution").replaceWith(attribution(result));
  showQuery(state.pinned);
}

// The input's mean loss, and with heads switched off the change from all heads on.
function showLoss(line, result) {
  line.replaceChildren();
  if (result.loss == null) return;
  line.append("loss on the input ");
  line.appendChild(el("b", "mg-loss-value", result.loss.toFixed(3)));
  if (result.off.length) {
    const rise = result.loss - result.base_loss;
    const change = el("span", rise >= 0 ? "mg-worse" : "mg-better", ` ${signed(rise, 3)}`);
    line.append(` (all heads on ${result.base_loss.toFixed(3)}`, change);
    line.append(`, ${result.off.length} off: ${result.ablation})`);
  }
}

function layerRow(run, result, heads, layer) {
  const row = el("div", "mg-layer");
  row.appendChild(el("div", "mg-layer-name", `layer ${layer}`));
  const maps = el("div", "mg-heads");
  heads.forEach((weights, head) => maps.appendChild(headFigure(run, result, weights, layer, head)));
  row.appendChild(maps);
  return row;
}

// ------------------------------------------------------------------------------ one head

function headFigure(run, result, weights, layer, head) {
  const figure = el("figure", "mg-head");
  figure.dataset.layer = layer;
  figure.dataset.head = head;
  const caption = el("figcaption", "mg-caption");
  const name = el("div", "mg-head-name");
  name.appendChild(el("span", "mg-head-id", `L${layer} H${head}`));
  const large = el("button", "mg-open", "⤢");
  large.title = "open this head large";
  large.addEventListener("click", (event) => {
    event.stopPropagation();
    openLarge(run, result, weights, layer, head);
  });
  name.append(el("span", "mg-off-delta"), large);
  caption.append(name, headLabel(result.heads[layer][head], result.group, result.measures));
  caption.title = "click to switch this head off (or on again)";
  caption.addEventListener("click", () => {
    const off = state.off[run.name];
    const id = `${layer}.${head}`;
    off.has(id) ? off.delete(id) : off.add(id);
    saveState();
    fillPanel(run, figure.closest(".mg-panel"));
  });
  figure.appendChild(caption);
  const map = figure.appendChild(heatmap(result, weights, cellSize(result.tokens.length)));
  figure.style.width = `${Math.max(76, map.width)}px`;
  figure.append(el("div", "mg-looks", "\u00a0"), el("div", "mg-dla"));
  return figure;
}

// A head's label from its run's analysis: its role (and in how many of the group's analysed
// seeds some head has that role), then the measures the server lists for captions
// (microgpt/heads/measures.py), each after its caption ("val +0.01"), its help on hover.
function headLabel(label, group, measures) {
  if (!label) return el("div", "mg-role mg-unanalysed", "not analysed");
  const box = el("div", "mg-role");
  box.appendChild(el("span", "mg-role-name", label.role));
  if (group.runs.length > 1) {
    const [k, n, all] = [group.roles[label.role] || 0, group.analysed, group.runs.length];
    const count = `${k} of ${n} seeds${n < all ? " analysed" : ""}`;
    // a mixed head has no role to find again: its line left blank, the maps kept in line
    const seeds = el("span", "mg-role-seeds", label.role === "mixed" ? "\u00a0" : count);
    seeds.title = `${label.role}: a head of ${k} of the group's ${n} analysed runs has it` +
      (n < all ? ` (${all - n} of its ${all} runs not analysed)` : "");
    box.appendChild(seeds);
  }
  const shown = measures.filter((m) => label[m.name] != null);
  const text = shown.map((m) => [m.caption, formatted(label[m.name], m.fmt)].join(" ").trim());
  const numbers = box.appendChild(el("span", "mg-role-numbers", text.join(" · ")));
  numbers.title = measures.map((m) => `${m.caption || m.name}: ${m.help}`).join("; ");
  return box;
}

// x as a Python format spec of the measures writes it: "+.2f" (signed), ".3f".
function formatted(x, fmt) {
  const [, sign, digits] = /^(\+?)\.(\d+)f$/.exec(fmt) || [null, "", "2"];
  return sign ? signed(x, +digits) : x.toFixed(+digits);
}

// What changes with the pin and the heads switched off: whether the head is off and the loss
// change when it alone is, its attribution bar, its reading.
function updateHead(figure, result) {
  const [layer, head] = [+figure.dataset.layer, +figure.dataset.head];
  const off = result.off.some(([l, h]) => l === layer && h === head);
  figure.classList.toggle("mg-is-off", off);
  const alone = (result.off_loss || []).find(([l, h]) => l === layer && h === head);
  const delta = figure.querySelector(".mg-off-delta");
  delta.textContent = alone ? ` input ${signed(alone[2], 3)}` : "";
  delta.title = "the loss change on the typed input (nats) when this head alone is off";
  const parts = result.attribution;
  const dla = figure.querySelector(".mg-dla");
  dla.replaceChildren();
  figure.title = "";
  if (!parts) return;
  const value = parts.heads[layer][head];
  dla.append(bar(value, largestPart(parts)), el("span", "mg-dla-value", signed(value)));
  dla.dataset.value = value;
  figure.title = (result.reading && result.reading[layer][head]) || "";
}

function bar(value, scale) {
  const track = el("span", "mg-bar");
  const fill = track.appendChild(el("span", value >= 0 ? "mg-up" : "mg-down"));
  const width = scale > 0 ? (50 * Math.abs(value)) / scale : 0;
  Object.assign(fill.style, { width: `${width}%`, left: value >= 0 ? "50%" : `${50 - width}%` });
  return track;
}

// A head's weights as /attention sends them (query q's weights on keys 0..q, q = 0..T-1 in order,
// a byte each, base64) -> T rows of T weights, 0 after the query.
function weightsOf(sent, T) {
  const bytes = Uint8Array.from(atob(sent), (c) => c.charCodeAt(0));
  const rows = [];
  for (let q = 0, at = 0; q < T; at += q + 1, q++) {
    const row = new Float32Array(T);
    for (let k = 0; k <= q; k++) row[k] = bytes[at + k] / 255;
    rows.push(row);
  }
  return rows;
}

// Token t of a names run is character t - 1 (token 0 is the boundary, character -1); a text run
// has no boundary token. Highlights go by character, so that both kinds of run line up.
function charOf(result, token) {
  return result.boundary ? token - 1 : token;
}

// A map's cell: labels while they stay readable (cell >= 10 px), a thumbnail beyond
function cellSize(T) {
  return T <= 12 ? 12 : T <= 20 ? 10 : Math.max(1, Math.floor(200 / T));
}

// A head's map: the key characters across the top, the query characters down the side (labels
// in the DOM, where a cell is large enough to read them), the weights drawn on a canvas (so that
// a long input stays quick to draw).
function heatmap(result, weights, cell) {
  const T = result.tokens.length;
  const labelled = cell >= 10;
  const map = el("div", "mg-map");
  map.style.setProperty("--cell", `${cell}px`);
  map.style.gridTemplateColumns = `${labelled ? cell : 0}px repeat(${T}, ${cell}px)`;
  map.style.gridTemplateRows = `${labelled ? cell : 0}px repeat(${T}, ${cell}px)`;
  Object.assign(map, { weights, tokens: result.tokens, cell, query: -1 });
  map.width = (T + (labelled ? 1 : 0)) * cell;
  map.chars = result.tokens.map((_, t) => charOf(result, t));
  if (labelled) {
    map.appendChild(el("span", "mg-corner"));
    result.tokens.forEach((token, k) => map.appendChild(labelCell(map, token, "mg-key", k)));
    result.tokens.forEach((token, q) => map.appendChild(labelCell(map, token, "mg-query", q)));
  }
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
    canvas.title = `${result.tokens[q]} → ${result.tokens[k]}: ${weights[q][k].toFixed(2)}`;
    if (q !== map.query) showQuery(map.chars[q]);
  });
  map.addEventListener("mouseover", (event) => {
    const label = event.target.closest(".mg-label");
    if (label) showQuery(parseInt(label.dataset.char, 10));
  });
  map.addEventListener("mouseleave", () => showQuery(state.pinned));
  map.addEventListener("click", () => pin(map.query >= 0 ? map.chars[map.query] : null));
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

// Pin character c (or unpin it, a second time): every run's attribution is asked for again.
function pin(c) {
  state.pinned = state.pinned === c ? null : c;
  refresh();
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
    if (q === map.query) continue;
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

// One head large, over the page: its labels readable, a long input scrolling inside.
function openLarge(run, result, weights, layer, head) {
  closeLarge();
  const shade = el("div", "mg-shade");
  shade.addEventListener("click", (event) => event.target === shade && closeLarge());
  const box = shade.appendChild(el("div", "mg-large"));
  const close = el("button", "mg-close", "×");
  close.addEventListener("click", closeLarge);
  const label = result.heads[layer][head];
  const role = label ? ` · ${label.role}` : "";
  box.append(close, el("h3", null, `${run.name} · L${layer} H${head}${role} · step ${result.step}`));
  const reading = result.reading && result.reading[layer][head];
  if (reading) box.appendChild(el("p", "mg-reading", reading));
  const T = result.tokens.length;
  const scroll = box.appendChild(el("div", "mg-large-map"));
  scroll.appendChild(heatmap(result, weights, Math.max(16, Math.min(28, Math.floor(560 / T)))));
  box.appendChild(el("div", "mg-looks", "\u00a0"));
  document.body.appendChild(shade);
  showQuery(state.pinned);
}

function closeLarge() {
  document.querySelectorAll(".mg-shade").forEach((shade) => shade.remove());
}

// ------------------------------------------------------------------------------ predictions

// Per position: the character there, the model's 5 likeliest next characters, the character
// that follows with its probability and loss. A click pins the position.
function predictions(result) {
  const strip = el("div", "mg-predictions"); // as wide as the room it has, scrolling inside
  const names = el("div", "mg-position mg-row-names");
  for (const text of ["", "top 5", "", "", "", "", "next", "p", "loss"]) {
    names.appendChild(el("span", null, text));
  }
  strip.appendChild(names);
  (result.predictions || []).forEach((guess, t) => {
    const column = el("div", "mg-position");
    column.dataset.position = t;
    column.appendChild(el("span", "mg-at", result.tokens[t]));
    for (let i = 0; i < 5; i++) {
      const [label, p] = guess.top[i] || ["", 0];
      const cell = el("span", "mg-top", `${label} ${p.toFixed(2).replace(/^0/, "")}`);
      cell.style.setProperty("--p", `${100 * p}%`);
      cell.classList.toggle("mg-hit", label === guess.next);
      column.appendChild(cell);
    }
    column.appendChild(el("span", "mg-next", guess.next === null ? "–" : guess.next));
    column.appendChild(el("span", "mg-p", guess.p == null ? "" : guess.p.toFixed(2)));
    const loss = column.appendChild(el("span", "mg-token-loss"));
    if (guess.loss != null) {
      loss.textContent = guess.loss.toFixed(2);
      loss.style.background = `rgba(229, 57, 53, ${Math.min(1, guess.loss / 5) * 0.6})`;
    }
    column.title = "click to pin this position";
    column.addEventListener("click", () => pin(charOf(result, t)));
    strip.appendChild(column);
  });
  return strip;
}

// ------------------------------------------------------------------------------ attribution

function largestPart(parts) {
  const values = [parts.embed, parts.rest, ...parts.mlps, ...parts.heads.flat()];
  return Math.max(...values.map(Math.abs), Math.abs(parts.logit));
}

// The pinned position's next-character logit split into what each part adds: a waterfall, each
// part's bar starting where the last one ended, so that the bars visibly sum to the logit.
function attribution(result) {
  const box = el("div", "mg-attribution");
  const parts = result.attribution;
  if (!parts) {
    const why = result.pin === null ? "click a character to pin it" : "nothing follows it";
    box.appendChild(el("p", "mg-note", `${why}: what each part adds to the next character`));
    return box;
  }
  const at = result.tokens[parts.position];
  const title = el("div", "mg-attribution-title");
  title.append(`logit of '${parts.target}' after '${at}' = `);
  title.appendChild(el("b", "mg-logit", parts.logit.toFixed(2)));
  const sort = el("button", "mg-sort", state.sort === "size" ? "in layer order" : "by size");
  sort.addEventListener("click", () => {
    state.sort = state.sort === "size" ? "layer" : "size";
    saveState();
    for (const panel of panels.children) {
      const old = panel.querySelector(".mg-attribution");
      if (old && panel.result) old.replaceWith(attribution(panel.result));
    }
  });
  title.appendChild(sort);
  box.appendChild(title);
  let rows = [["embeddings", parts.embed, "the token and position embeddings"]];
  parts.heads.forEach((heads, layer) => {
    heads.forEach((v, head) => rows.push([`L${layer} H${head}`, v, result.reading?.[layer]?.[head]]));
    const mlp = [`MLP ${layer}`, parts.mlps[layer], `layer ${layer}'s MLP`];
    if (parts.mlps.length) rows.push(mlp); // none in an attention-only model
  });
  rows.push(["rest", parts.rest, "the biases and what the final norm's centering takes away"]);
  if (state.sort === "size") rows = rows.sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]));
  const heads = rows.filter(([name]) => name.startsWith("L"));
  const reading = heads.length && heads.reduce((a, b) => (Math.abs(b[1]) > Math.abs(a[1]) ? b : a));
  if (reading && reading[2]) box.appendChild(el("p", "mg-reading", reading[2]));
  // the scale: every running sum, zero and the logit in view
  let sum = 0;
  const ends = [0, parts.logit];
  for (const [, v] of rows) ends.push((sum += v));
  const [lo, hi] = [Math.min(...ends), Math.max(...ends)];
  const x = (v) => (100 * (v - lo)) / (hi - lo || 1);
  sum = 0;
  const list = el("div", "mg-waterfall");
  for (const [name, v, why] of [...rows, ["= logit", parts.logit, "the sum of the parts"]]) {
    const total = name === "= logit";
    const start = total ? 0 : sum;
    const row = el("div", total ? "mg-part mg-total" : "mg-part");
    row.dataset.value = v;
    row.title = why || "";
    const track = el("span", "mg-track");
    const fill = track.appendChild(el("span", v >= 0 ? "mg-up" : "mg-down"));
    const [a, b] = [x(Math.min(start, start + v)), x(Math.max(start, start + v))];
    Object.assign(fill.style, { left: `${a}%`, width: `${b - a}%` });
    track.appendChild(el("span", "mg-zero")).style.left = `${x(0)}%`;
    row.append(el("span", "mg-part-name", name), track, el("span", "mg-part-value", signed(v)));
    list.appendChild(row);
    if (!total) sum += v;
  }
  box.appendChild(list);
  return box;
}

// ------------------------------------------------------------------------------ the timeline

// The validation loss over steps (a line; and the registry's lines, the largest induction score,
// where the checkpoints are analysed), under it each head's score at each step checkpoint (one row per head, darker =
// higher), and a line at the step shown; a click picks that step.
function drawTimeline(box, timeline, choose) {
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = (tag, attrs) => {
    const node = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  };
  const points = timeline.checkpoints.filter((c) => Number.isInteger(c.step));
  const steps = [...timeline.val.map(([s]) => s), ...points.map((c) => c.step)];
  if (!steps.length) return;
  // each head's score (null: not analysed), its role
  for (const c of points) c.scores = c.heads && c.heads.flat().map((label) => label && label.score);
  const scored = points.find((c) => c.scores);
  const rows = scored ? scored.scores.length : 0;
  const [W, lossH, rowH] = [260, 44, Math.max(2, Math.min(6, Math.floor(64 / (rows || 1))))];
  const H = lossH + 4 + rows * rowH;
  const [s0, s1] = [Math.min(...steps), Math.max(...steps)];
  const x = (s) => 4 + ((W - 8) * (s - s0)) / (s1 - s0 || 1);
  const chart = svg("svg", { width: W, height: H, class: "mg-timeline-chart" });
  const losses = timeline.val.map(([, v]) => v);
  if (losses.length) {
    const [v0, v1] = [Math.min(...losses), Math.max(...losses)];
    const y = (v) => 4 + ((lossH - 8) * (v1 - v)) / (v1 - v0 || 1);
    const path = timeline.val.map(([s, v], i) => `${i ? "L" : "M"}${x(s)},${y(v)}`).join("");
    chart.appendChild(svg("path", { d: path, class: "mg-val-line" }));
    const text = svg("text", { x: W - 4, y: 12, class: "mg-chart-label", "text-anchor": "end" });
    text.textContent = `val loss ${v0.toFixed(2)}–${v1.toFixed(2)}`;
    chart.appendChild(text);
  }
  // each line the server lists (microgpt/heads/measures.py: the largest induction score) at each
  // analysed checkpoint, on a 0-1 scale, its help on hover
  (timeline.lines || []).forEach((line, n) => {
    const value = (c) => c.summaries && c.summaries[line.name];
    const drawn = points.filter((c) => value(c) != null);
    if (!drawn.length) return;
    const top = (c) => Math.max(0, value(c));
    const y = (v) => lossH - 4 - (lossH - 8) * Math.min(1, v);
    const path = drawn.map((c, i) => `${i ? "L" : "M"}${x(c.step)},${y(top(c))}`).join("");
    chart.appendChild(svg("path", { d: path, class: "mg-induction-line" }));
    const text = svg("text", { x: W - 4, y: 24 + 12 * n, class: "mg-chart-label mg-induction-label", "text-anchor": "end" });
    text.textContent = `${line.line} ${formatted(top(drawn[drawn.length - 1]), line.fmt)}`;
    const title = svg("title", {});
    title.textContent = line.help;
    text.appendChild(title);
    chart.appendChild(text);
  });
  const width = Math.max(2, (W - 8) / Math.max(points.length, 1) - 1);
  for (const point of points) {
    (point.scores || []).forEach((score, i) => {
      const cell = svg("rect", {
        x: x(point.step) - width / 2, y: lossH + 4 + i * rowH, width, height: rowH - 1,
        fill: `rgba(25, 118, 210, ${0.08 + 0.92 * Math.max(0, Math.min(1, score ?? 0))})`,
      }); // prettier-ignore
      const role = point.heads.flat()[i]?.role || "";
      const title = svg("title", {});
      title.textContent = `step ${point.step} · head ${i}: ${role} ${(score ?? 0).toFixed(2)}`;
      cell.appendChild(title);
      chart.appendChild(cell);
    });
    const hit = svg("rect", { x: x(point.step) - width / 2, y: 0, width, height: H, class: "mg-hit-area" });
    hit.addEventListener("click", () => choose(point.checkpoint));
    chart.appendChild(hit);
  }
  const now = svg("line", { y1: 0, y2: H, class: "mg-now" });
  now.scale = x;
  chart.appendChild(now);
  box.replaceChildren(chart);
  if (scored) box.appendChild(el("div", "mg-chart-note", "each head's score, one row per head"));
  const panel = box.closest(".mg-panel");
  if (panel && panel.result) placeNow(now, panel.result.step);
}

function placeNow(line, step) {
  line.setAttribute("x1", line.scale(step));
  line.setAttribute("x2", line.scale(step));
}
