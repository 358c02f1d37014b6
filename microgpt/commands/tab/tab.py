"""The microgpt tab of TensorBoard (pyproject.toml's `tensorboard_plugins` entry point), shown when
the log directory holds microgpt runs. Its routes, under http://HOST:PORT/data/plugin/microgpt/,
answer JSON, or 400 and {"error": message} (a message naming the parameter and the fix):

    /index.js, /style.css          the page (static/: plain JavaScript and CSS, no build)
    /runs                          {"runs": [{"name", "checkpoints", "snapshots", "analysed"}],
                                    "groups", "example"}: snapshots: [[name, step], ...], each
                                    step-N.pt in step order;
                                    groups: [{"name", "runs", "seeds"}], runs that differ only
                                    by seed (microgpt/groups.py), runs[i] trained with seeds[i]
    /attention?run=&checkpoint=&input=&off=&ablation=&pin=       RunStore.attention: one run's
        model on the input, the heads `off` ("0.1,1.3": layer.head) switched off by `ablation`
        ("zero", the default, or "mean": the head's mean output over the validation split), the
        position `pin` (default: none) attributed:
        {"run", "checkpoint", "step", "format", "boundary", "n_layer", "n_head", "tokens",
         "layers": [layer][head] the attention with the heads off: query q's weights on keys
             0..q, q = 0..T-1 in order, a byte each (weight x 255), base64 (lab.causal_bytes),
         "analysis", "heads": [layer][head] {"role", and a value of each of "measures"} | null,
         "measures": [{"name", "caption", "fmt", "help"}]: what a head's caption shows of its
             analysis (the measures with a caption, microgpt/heads/measures.py),
         "group": {"name", "runs", "seeds", "analysed": how many of the group's runs have an
             analysis of this checkpoint, "roles": {role: in how many of those some head has it}},
         "off": [[L, H], ...], "ablation", "pin",
         "predictions": per position {"top": [[label, p], ...5], "next": label | null,
                                      "p": p of next | null, "loss": -ln p | null},
         "loss": the mean over positions with a next character, with `off`; "base_loss": with no
         head off; "off_loss": [[L, H, the input's loss change with that head alone off], ...],
         "attribution": null (no pin, or no next character at pin) | {"position", "target",
             "logit", "embed", "heads": [layer][head], "mlps": [layer] ([]: an attention-only
             model), "rest"}: the parts add up to the logit (microgpt/heads/attribution.py),
         "reading": null (no pin) | [layer][head] "L0H2 looks 1 back at 'h' and adds +1.30 to 'i'"}
    /timeline?run=                 {"run", "val": [[step, validation loss], ...],
                                    "checkpoints": [{"checkpoint", "step", "heads" (as
                                    /attention's), "summaries": {each line's name: value}}]}:
                                    each step-N.pt in step order, from its analysis (null: not
                                    analysed)
                                    "lines": [{"name", "line", "fmt", "help"}]: the summaries
                                    drawn over the steps (their `line`, measures.py),
                                    "skipped": the lines of metrics.jsonl not read, each named

Labels of tokens are the tokenizer's: "·" a space, "<s>" the boundary (a name's start and end;
the page names it so everywhere). Only what lies under the log dirs is read: a run folder,
checkpoint or analysis reached through a link leading out is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from microgpt.commands.tab.attention import InputError, RunStore, log_dirs, runs_under

STATIC = Path(__file__).parent / "static"
FILES = {"/index.js": "application/javascript", "/style.css": "text/css"}


class MicrogptPlugin(base_plugin.TBPlugin):
    """Every head's attention on a typed input, for each run of a sweep side by side."""

    plugin_name = "microgpt"

    def __init__(self, context: base_plugin.TBContext):
        spec = getattr(context.flags, "logdir_spec", None)  # tensorboard --logdir_spec a:DIR,...
        self.store = RunStore(log_dirs(context.logdir, spec))

    def is_active(self) -> bool:
        return bool(runs_under(self.store.roots))

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(
            es_module_path="/index.js", tab_name="microgpt", disable_reload=True
        )

    def get_plugin_apps(self) -> dict:
        routes = {"/runs": self._runs, "/attention": self._attention, "/timeline": self._timeline}
        return {**dict.fromkeys(FILES, self._static), **routes}

    @wrappers.Request.application
    def _static(self, request):
        name = request.path.rsplit("/", 1)[-1]
        return http_util.Respond(request, (STATIC / name).read_bytes(), FILES["/" + name])

    @wrappers.Request.application
    def _runs(self, request):
        body = {"runs": self.store.runs(), "groups": self.store.groups()}
        return _json(request, {**body, "example": self.store.example()})

    @wrappers.Request.application
    def _attention(self, request):
        a = request.args
        run, checkpoint, text = a.get("run", ""), a.get("checkpoint") or None, a.get("input", "")
        off, ablation, pin = a.get("off", ""), a.get("ablation"), a.get("pin")
        return _answer(
            request, lambda: self.store.attention(run, checkpoint, text, off, ablation, pin)
        )

    @wrappers.Request.application
    def _timeline(self, request):
        return _answer(request, lambda: self.store.timeline(request.args.get("run", "")))


def _answer(request, body):
    """body() as JSON, or its InputError as 400 and {"error": message}."""
    try:
        return _json(request, body())
    except InputError as e:
        return _json(request, {"error": str(e)}, code=400)


def _json(request, body: dict, code: int = 200):
    try:
        text = json.dumps(body, allow_nan=False)
    except ValueError:  # NaN or Infinity (a diverged run's loss) are not JSON: null
        text = json.dumps(json.loads(json.dumps(body), parse_constant=lambda constant: None))
    return http_util.Respond(request, text, "application/json", code=code)
