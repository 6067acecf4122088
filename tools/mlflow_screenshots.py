"""Screenshots of a study in MLflow's web UI, opened the way a researcher opens it.

    python tools/mlflow_screenshots.py                      # after `make demo`: ./flatlab-runs, its demo study
    python tools/mlflow_screenshots.py --run-demo --root /tmp/demo --out /tmp/shots
    python tools/mlflow_screenshots.py --root ROOT --study NAME --out DIR

Serves the root's MLflow store with ``mlflow server`` on 127.0.0.1 (a free port; stopped at the end),
drives headless Chromium (Debian's ``chromium``, a fresh profile, through its DevTools protocol on
127.0.0.1) through the links flatlab prints, and saves one PNG per page in ``--out`` with the page's
visible text next to it (``<page>.txt``):

* ``1_runs``: the runs table (training view, flatlab's default view: the trials best first, the default
  columns);
* ``1b_runs_end``: the same table scrolled to its end (pruned trials, the launch run);
* ``2_charts``: the same runs as charts;
* ``3_trial``, ``3b_trial_curves``: the best final-stage (else search) trial's metric charts (its summary
  values as bars, then scrolled to its training curves);
* ``4_parent``: the launch run's per-arm summary table (``report/best_per_arm.json``);
* ``5_models``: the experiment's logged models;
* ``6_model``: the best trial's logged model.

Then it prints, per page, whether the texts a researcher should see are there (run names such as
``sgd · final · seed 1``, the default columns, the study metric's chart section) and exits 1 if one is
missing. The browser profile is one a researcher has used once: MLflow's assistant panel, which opens
by itself on a first visit and covers a third of the page, starts closed (two ``localStorage`` entries
the UI keeps, ``mlflow.assistant.*``). Nothing listens beyond 127.0.0.1, and both processes are stopped
(by their own ids) however the script ends.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]
WIDTH, HEIGHT = 1600, 1000
# MLflow 3.17's UI opens its assistant panel on a first visit and remembers it in these entries
SEEN_BEFORE = (
    "try { localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
    " localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false'); } catch (e) {}"
)
SCROLL_TO_SECTION = (
    "Array.from(document.querySelectorAll('span, div, h3, h4'))"
    ".find(e => e.children.length === 0 && e.textContent.trim() === '{section}')"
    "?.scrollIntoView({{block: 'start'}})"
)
SCROLL_TO_END = (
    "document.querySelectorAll('.ag-body-viewport, .ag-center-cols-viewport')"
    ".forEach(e => { e.scrollTop = e.scrollHeight; })"
)
DEMO = ["run", "studies/digits_flatness.py", "--scale", "demo"]  # what `make demo` runs
DEMO_STUDY = "digits_flatness_demo"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tracking_uri: str, port: int, log: Path) -> subprocess.Popen:
    """``mlflow server`` for ``tracking_uri`` on 127.0.0.1:``port`` (one worker), once it answers /health.

    Raises:
        RuntimeError: it exited or did not answer within 120 s (its log is named).
    """
    mlflow = Path(sys.executable).with_name("mlflow")
    cmd = [
        str(mlflow) if mlflow.exists() else "mlflow",
        "server",
        "--backend-store-uri",
        tracking_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"mlflow server did not answer on 127.0.0.1:{port} within 120 s; see {log}")


def stop(proc: Optional[subprocess.Popen]) -> None:
    """Terminate ``proc`` (this script's child), then kill it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def pages(tracking_uri: str, study: str, base: str) -> List[Tuple[str, str, List[str], str]]:
    """``(name, url, texts the page must show, script to run once they show)`` for each page, from the
    study's latest launch."""
    sys.path.insert(0, str(ROOT / "platform"))
    from flatlab.tracking import logged_model, runs, ui
    from flatlab.tracking.trials import parent_runs, trials_frame

    client = runs.client(tracking_uri)
    parent = parent_runs(tracking_uri, study)[0]
    exp = parent.info.experiment_id
    df = trials_frame(tracking_uri, study)
    done = df[df["outcome"] == "completed"]
    final = done[done["stage"] == "final"]
    best = (final if len(final) else done).iloc[0]
    name = ui.trial_run_name(best["arm"], best["stage"], best["seed"], best["trial_id"])
    model_id = logged_model.run_model_id(client, best["run_id"])
    metric = parent.data.params.get("metric", "val/accuracy")
    pruned = df[df["outcome"] == "pruned"]
    section = metric.rsplit("/", 1)[0] if "/" in metric else ui.MODEL_METRICS
    out = [
        ("1_runs", ui.runs_url(base, exp), [name, metric, "flatlab.outcome", "Model training"], ""),
        ("1b_runs_end", ui.runs_url(base, exp), ["pruned"] if len(pruned) else [], SCROLL_TO_END),
        ("2_charts", ui.runs_url(base, exp) + "&compareRunsMode=CHART", [f"{section} (", metric], ""),
        ("3_trial", ui.run_url(base, exp, best["run_id"], "model-metrics"), [name, "train_step (", "flat ("], ""),
        (
            "3b_trial_curves",
            ui.run_url(base, exp, best["run_id"], "model-metrics"),
            [name, "train_step ("],
            SCROLL_TO_SECTION.format(section="train"),
        ),
        (
            "4_parent",
            ui.run_url(base, exp, parent.info.run_id, "artifacts/report/best_per_arm.json"),
            ["best_per_arm.json", name if best["stage"] != "final" else str(best["arm"])],
            "",
        ),
        (
            "5_models",
            ui.models_url(base, exp),
            [ui.model_name(best["arm"], best["stage"], best["seed"], best["trial_id"])],
            "",
        ),
    ]
    if model_id:
        out.append(
            (
                "6_model",
                f"{base}/#/experiments/{exp}/models/{model_id}?workflowType=machine_learning",
                [model_id, "Register model"],
                "",
            )
        )
    return out


class Page:
    """One Chromium tab driven through the DevTools protocol (a websocket on 127.0.0.1)."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.n = ws, 0

    async def call(self, method: str, **params: Any) -> Dict[str, Any]:
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json()
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def text(self) -> str:
        """The page's visible text (a chart section's count, on a line of its own, joined to its name)."""
        r = await self.call(
            "Runtime.evaluate", expression="document.body ? document.body.innerText : ''", returnByValue=True
        )
        return str(r.get("result", {}).get("value", "")).replace("\n(", " (")

    async def open(
        self, url: str, wanted: List[str], script: str = "", timeout_s: float = 90.0
    ) -> Tuple[str, List[str]]:
        """Load ``url``; wait until its text holds every one of ``wanted`` (or ``timeout_s`` passes; the
        first load fetches MLflow's 27 MB of scripts), run ``script``, then wait for the charts to settle.
        Returns the text and what is missing."""
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            text = await self.text()
            if "Runs" in text and not [w for w in wanted if w not in text] and "Loading" not in text:
                break
        if script:
            await asyncio.sleep(2.0)
            await self.call("Runtime.evaluate", expression=script)
        await asyncio.sleep(8.0)  # charts draw after the data arrives
        text = await self.text()
        return text, [w for w in wanted if w not in text]

    async def shot(self, path: Path) -> None:
        data = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(data["data"]))


async def screenshots(shots: List[Tuple[str, str, List[str], str]], out: Path) -> Dict[str, List[str]]:
    """Open each page in a fresh headless Chromium; save ``<name>.png`` and ``<name>.txt``; returns the
    missing texts per page."""
    import aiohttp

    profile = Path(tempfile.mkdtemp(prefix="mlflow-shots-chromium-"))
    proc = subprocess.Popen(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    missing: Dict[str, List[str]] = {}
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        port = port_file.read_text().split()[0]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
                tab = next(t for t in await r.json() if t["type"] == "page")
            async with session.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                await page.call("Page.addScriptToEvaluateOnNewDocument", source=SEEN_BEFORE)
                await page.call(
                    "Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False
                )
                for name, url, wanted, script in shots:
                    text, missing[name] = await page.open(url, wanted, script)
                    await page.shot(out / f"{name}.png")
                    (out / f"{name}.txt").write_text(url + "\n\n" + text)
    finally:
        stop(proc)
        shutil.rmtree(profile, ignore_errors=True)
    return missing


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(ROOT / "flatlab-runs"), help="the flatlab root (default: ./flatlab-runs)")
    parser.add_argument("--study", default=DEMO_STUDY, help=f"the study (default: {DEMO_STUDY})")
    parser.add_argument("--out", default=str(ROOT / "mlflow-screenshots"), help="folder for the PNGs")
    parser.add_argument(
        "--run-demo", action="store_true", help="run `flatlab " + " ".join(DEMO) + "` under --root first"
    )
    args = parser.parse_args(argv)
    root, out = Path(args.root).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.run_demo:
        flatlab = Path(sys.executable).with_name("flatlab")
        subprocess.run(
            [str(flatlab) if flatlab.exists() else "flatlab", *DEMO, "--root", str(root)], cwd=ROOT, check=True
        )
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    if not (root / "mlflow.db").exists():
        print(
            f"no MLflow store at {root / 'mlflow.db'}: run `make demo` (or pass --run-demo / --root)", file=sys.stderr
        )
        return 2
    port = free_port()
    server = None
    try:
        server = serve(tracking_uri, port, out / "mlflow-server.log")
        shots = pages(tracking_uri, args.study, f"http://127.0.0.1:{port}")
        missing = asyncio.run(screenshots(shots, out))
    finally:
        stop(server)
    for name, url, _, _ in shots:
        status = "ok" if not missing[name] else "MISSING " + ", ".join(repr(m) for m in missing[name])
        print(f"{name}: {status}  ({out / (name + '.png')})\n    {url}")
    return 1 if any(missing.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
