"""The screenshots of the microgpt tab in docs/: a real TensorBoard on a sweep, shot in headless
Chromium (Debian's `chromium`) at 1600 px wide.

    python docs/screenshots.py                       # trains a small sweep first (~2 min, 1 core)
    python docs/screenshots.py --sweep multirun/DATE/TIME --out /tmp/shots
    python docs/screenshots.py --keep /tmp/lab      # trains into /tmp/lab (a new folder), kept

Without --sweep it trains, in a new temporary folder, names runs heads=1,2,4,8 (the small preset,
a few hundred steps, step checkpoints, each analysed; heads=4 at every step checkpoint) and a text
run (text, on a sonnet) in one log dir. It writes only the PNGs it owns (NAMES) into --out, and
replaces only those: nothing else there is touched. The tests drive the page with `Browser` and
`tensorboard` below.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from microgpt import entry
from microgpt.files import atomic_write, check_new_file, project_data

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NAMES = {  # what each PNG shows
    "tensorboard_microgpt_tab.png": "the tab on a names sweep, as it opens",
    "tensorboard_microgpt_hover.png": "a head switched off, a character pinned: its attribution",
    "tensorboard_microgpt_text.png": "a text run on a line of text, one head opened large",
    "tensorboard_microgpt_scalars.png": "the Scalars tab of the same sweep",
    "tensorboard_attention.png": "the Images tab: layer 0's attention maps, two heads a row",
}
LINE = "Shall I compare thee to a summer's day?\nThou art more lovely"
SONNET = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.
"""


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: no
    port, no extra package): open a page, evaluate JavaScript in it, wait, take a screenshot."""

    def __init__(self, width: int = 1600, height: int = 1000):
        to_chrome, from_chrome = os.pipe(), os.pipe()
        # Chromium reads commands on fd 3 and writes on fd 4; high copies first, so dup2 is safe
        ends = (to_chrome[0], from_chrome[1])
        theirs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in ends]
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        command += ["--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,  # only fds 3 and 4 are inheritable (PEP 446)
            preexec_fn=lambda: (os.dup2(theirs[0], 3), os.dup2(theirs[1], 4)),
        )
        for fd in (*theirs, *ends):
            os.close(fd)
        self.writer, self.reader = os.fdopen(to_chrome[1], "wb"), os.fdopen(from_chrome[0], "rb")
        self.buffer, self.last_id, self.session = b"", 0, None
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        attached = self.send("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]
        self.size(width, height)

    def send(self, method: str, **params) -> dict:
        """One protocol command's result (events meanwhile are dropped); a RuntimeError if it
        fails."""
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        self.writer.write(json.dumps(message).encode() + b"\0")
        self.writer.flush()
        while True:
            while b"\0" not in self.buffer:
                chunk = self.reader.read1(1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium quit while answering {method}")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.last_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def size(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip

    def open(self, url: str) -> None:
        """Load `url` afresh (a URL that differs from the last in its "#..." alone too)."""
        self.send("Page.navigate", url="about:blank")
        self.send("Page.navigate", url=url)

    def eval(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, condition: str, timeout: float = 30) -> None:
        """Until the JavaScript `condition` holds (tried every 50 ms); a TimeoutError after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.eval(f"!!({condition})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {condition}")
            time.sleep(0.05)

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        with atomic_write(path) as f:  # never through a link (files.refuse_link)
            f.write(base64.b64decode(data))

    def close(self) -> None:
        self.writer.close()
        self.process.terminate()
        self.process.wait(timeout=10)
        self.reader.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_) -> None:
        self.close()


@contextlib.contextmanager
def tensorboard(logdir_spec: str) -> Iterator[str]:
    """A real TensorBoard on `logdir_spec` (a folder, or `name:DIR,...`), its URL while open."""
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "tensorboard.main", "--logdir_spec", logdir_spec]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=2) as r:
                    listing = json.load(r)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"TensorBoard did not start: {server.stderr.read()}")
                time.sleep(0.3)
        if "microgpt" not in listing:
            raise RuntimeError("no microgpt tab in TensorBoard: pip install -e .")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def page(url: str, **state: str) -> str:
    """The tab's page alone (no TensorBoard around it), its state in the URL (index.js)."""
    return f"{url}/data/plugin_entry.html?name=microgpt#{urllib.parse.urlencode(state)}"


def in_panels(condition: str) -> str:
    """A JavaScript test that every panel has answered and `condition` (on `panels`) holds."""
    return (f"(() => {{ const panels = [...document.querySelectorAll('.mg-panel')]; "
            f"return panels.length > 0 && panels.every((p) => p.result || p.querySelector("
            f"'.mg-error')) && ({condition}); }})()")  # fmt: skip


# ----------------------------------------------------------------------------- the sweep


def train_sweep(sweep: Path, steps: int) -> None:
    """Names runs heads=1,2,4,8 (each analysed) and a text run (text) in the new folder `sweep`."""
    python = [sys.executable]
    common = [f"train.max_steps={steps}", f"train.eval_every={steps // 4}", "train.num_samples=0",
              f"train.save_every={steps // 8}", f"log.attn_every={steps // 2}"]  # fmt: skip
    run = lambda *args: subprocess.run([*python, *args], cwd=REPO, check=True)  # noqa: E731
    run("train.py", "-m", "heads=1,2,4,8", *common, f"hydra.sweep.dir={sweep}")
    for heads in (1, 2, 4, 8):
        more = ["--all-checkpoints"] if heads == 4 else []
        run("-m", "microgpt.heads", str(sweep / f"heads={heads}"), *more)
    (sweep / "sonnet.txt").write_text(SONNET * 30)
    text = ["data.format=text", f"data.path={sweep / 'sonnet.txt'}", "model.block_size=64"]
    run("train.py", *text, *common, f"out_dir={sweep / 'text'}")
    run("-m", "microgpt.heads", str(sweep / "text"))


# ----------------------------------------------------------------------------- the shots


def shoot(url: str, out: Path, line: str) -> list[Path]:
    """Every PNG of NAMES into `out` (`line`: the text run's input); their paths."""
    made = []
    with Browser(1600, 1100) as browser:
        # the tab as it opens, inside TensorBoard (its page is in an iframe)
        browser.open(f"{url}/#microgpt")
        frame = "document.querySelector('iframe')?.contentDocument"
        browser.wait(f"{frame}?.querySelectorAll('.mg-panel .mg-head').length > 0", 60)
        names = [r["name"] for r in browser.eval(f"fetch('{url}/data/plugin/microgpt/runs')"
                                                   ".then((r) => r.json())")["runs"]]  # fmt: skip
        wide = [n for n in names if "heads=" in n]  # a sweep's runs, by head count
        if wide:  # the sweep's runs alone: a text run would show that it cannot read a name
            choices = f"[...{frame}.querySelectorAll('.mg-run-choice')]"
            browser.eval(f"{choices}.filter((c) => !c.textContent.includes('heads='))"
                         ".forEach((c) => c.firstChild.click())")  # fmt: skip
        time.sleep(1)
        made.append(_shot(browser, out, "tensorboard_microgpt_tab.png"))
        if wide:  # a head switched off and a character pinned, on the page alone
            run = next((n for n in wide if n.endswith("heads=4")), wide[-1])
            browser.open(page(url, runs=run, q="2", **{f"off:{run}": "0.1"}))
            browser.wait(in_panels("true"))
            made.append(_shot(browser, out, "tensorboard_microgpt_hover.png"))
        # a text run on a line, one head opened large
        text = [n for n in names if "heads=" not in n]
        if text:
            browser.open(page(url, runs=text[0], input=line, q=str(len(line) // 2)))
            browser.wait(in_panels("document.querySelector('.mg-open')"), 60)
            browser.eval("document.querySelector('.mg-open').click()")
            browser.wait("document.querySelector('.mg-large canvas')")
            made.append(_shot(browser, out, "tensorboard_microgpt_text.png"))
        browser.open(f"{url}/#scalars")
        browser.wait("document.querySelectorAll('svg, canvas').length > 4", 60)
        time.sleep(3)
        made.append(_shot(browser, out, "tensorboard_microgpt_scalars.png"))
        browser.open(f"{url}/#images&tagFilter=attention%2Flayer0%24")  # each run's layer-0 maps
        time.sleep(8)  # the dashboard's images sit in shadow roots: no query waits on them
        made.append(_shot(browser, out, "tensorboard_attention.png"))
    return made


def _shot(browser: Browser, out: Path, name: str) -> Path:
    browser.screenshot(out / name)  # checked in main: its own file there, never through a link
    return out / name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", help="a log dir (or spec) to shoot; else a sweep trained here")
    parser.add_argument("--keep", type=Path, help="a new folder to train the sweep into, kept")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where the PNGs go")
    parser.add_argument("--steps", type=int, default=400, help="training steps of the runs")
    parser.add_argument("--line", default=LINE, help="the text run's input")
    args = parser.parse_args(argv)
    for name in NAMES:  # the PNGs it owns, replaced; never through a link, never the project's data
        check_new_file(args.out / name, "--out", protected=project_data(), own=True)
    if CHROMIUM is None:
        parser.error("chromium is not installed (apt-get install chromium)")
    if args.keep and args.keep.exists():
        parser.error(f"--keep {args.keep} exists: give a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="microgpt-shots-") as scratch:
        start = time.monotonic()
        spec = args.sweep or str(args.keep or Path(scratch) / "sweep")
        if not args.sweep:
            train_sweep(Path(spec), args.steps)
        trained = time.monotonic() - start
        with tensorboard(spec) as url:
            for path in shoot(url, args.out, args.line):
                print(f"{path}: {NAMES[path.name]}")
    print(f"trained in {trained:.0f} s, shot in {time.monotonic() - start - trained:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(entry.run(main))  # a refused --out, an OSError: one line, exit 2
