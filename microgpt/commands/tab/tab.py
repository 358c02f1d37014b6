"""The microgpt tab of TensorBoard (pyproject.toml's `tensorboard_plugins` entry point), shown when
the log directory holds microgpt runs. Its routes, under http://HOST:PORT/data/plugin/microgpt/:

    /index.js, /style.css                the page (static/: plain JavaScript and CSS, no build)
    /runs                                {"runs": [{"name", "checkpoints", "analysed"}], "example"}
    /attention?run=&checkpoint=&input=   RunStore.attention, or 400 and {"error": message}
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
        routes = {"/runs": self._runs, "/attention": self._attention}
        return {**dict.fromkeys(FILES, self._static), **routes}

    @wrappers.Request.application
    def _static(self, request):
        name = request.path.rsplit("/", 1)[-1]
        return http_util.Respond(request, (STATIC / name).read_bytes(), FILES["/" + name])

    @wrappers.Request.application
    def _runs(self, request):
        return _json(request, {"runs": self.store.runs(), "example": self.store.example()})

    @wrappers.Request.application
    def _attention(self, request):
        run, checkpoint = request.args.get("run", ""), request.args.get("checkpoint") or None
        try:
            body = self.store.attention(run, checkpoint, request.args.get("input", ""))
        except InputError as e:
            return _json(request, {"error": str(e)}, code=400)
        return _json(request, body)


def _json(request, body: dict, code: int = 200):
    return http_util.Respond(request, json.dumps(body), "application/json", code=code)
