"""Check the Ray dashboard claim in a real browser: start a local sweep with ``--dashboard``, load the dashboard's
pages in headless Chromium while a trial trains, save a screenshot of each, and keep what Ray's metrics endpoint
exports of our ``calsweep_*`` gauges.

    apt-get install -y chromium        # Debian's package
    CALSWEEP_DATA_DIR=../shared/data python benchmarks/dashboard_screenshot.py --out docs/dashboard

writes ``OUT/<page>.png`` (overview, jobs, actors, metrics), ``OUT/calsweep_metrics.txt`` (the gauges in Prometheus'
text format, read from the node's metrics export port: what Prometheus would scrape) and ``OUT/dashboard.json``
(URL, pages, date). The sweep is the tests' tiny random-init model with enough steps to be mid-training while the
pages load; it is stopped afterwards. Not part of CI (it needs Chromium and takes about two minutes).

A local Ray cluster turns on token authentication: a browser is asked for the token (``ray get-auth-token``), which
the dashboard then keeps in a cookie. Headless Chromium cannot type it, so the pages are loaded through a loopback
proxy that adds the token as the ``Authorization`` header, as Ray's own clients send it.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = ("overview", "jobs", "actors", "metrics")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")


def start_sweep(results: Path, steps: int) -> tuple[subprocess.Popen, str]:
    """The tiny sweep with the dashboard, in its own process group; returns it once a trial is training, with the
    dashboard's URL."""
    command = [sys.executable, str(REPO / "sweeps" / "launch.py"), "--config",
               str(REPO / "tests" / "sweeps" / "tiny_sweep.yaml"), "--dashboard", "--results-dir", str(results),
               f"train.max_steps={steps}", "train.log_every=1", "eval.tasks=[arc_easy]", "eval.limit=4"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    url = None
    for line in process.stdout:
        print(line, end="", flush=True)
        found = re.match(r"Ray dashboard: (http\S+)", line)
        url = found[1] if found else url
        if url and re.search(r": step \d+/", line):  # a trial reports from its workers: everything is up
            return process, url
    raise RuntimeError(f"expected the sweep to print its dashboard URL and a training step, got exit "
                       f"{process.wait()} (url {url})")


def screenshot(chromium: str, url: str, path: Path, width: int, height: int) -> None:
    """``url`` rendered by headless Chromium (fresh profile, JavaScript given 15 s of virtual time) into ``path``."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        "--virtual-time-budget=15000", f"--screenshot={path}", url],
                       check=True, capture_output=True, timeout=120)


def auth_headers() -> dict[str, str]:
    """The local cluster's token as Ray's clients send it (none when token authentication is off)."""
    token = subprocess.run(["ray", "get-auth-token"], capture_output=True, text=True).stdout.strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def start_proxy(target: str, headers: dict[str, str]) -> http.server.ThreadingHTTPServer:
    """A loopback HTTP server forwarding every request to ``target`` with ``headers`` added."""

    class Forward(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._forward()

        def do_POST(self) -> None:  # noqa: N802
            self._forward()

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            kept = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            request = urllib.request.Request(target + self.path, data=self.rfile.read(length) if length else None,
                                             headers={**kept, **headers}, method=self.command)
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    status, reply, body = response.status, response.headers, response.read()
            except urllib.error.HTTPError as error:
                status, reply, body = error.code, error.headers, error.read()
            self.send_response(status)
            for key, value in reply.items():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def calsweep_metrics(url: str, headers: dict[str, str]) -> str:
    """The ``calsweep_*`` lines of every node's metrics export (Prometheus text), found through the dashboard's
    node list."""
    request = urllib.request.Request(f"{url}/nodes?view=summary", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        nodes = json.load(response)["data"]["summary"]
    lines = []
    for node in nodes:
        raylet = node.get("raylet", {})
        port, address = raylet.get("metricsExportPort"), raylet.get("nodeManagerAddress", "127.0.0.1")
        if port:
            with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=10) as response:
                lines += [line for line in response.read().decode().splitlines() if "calsweep_" in line]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "dashboard"))
    parser.add_argument("--steps", type=int, default=60, help="training steps per trial (the pages load meanwhile)")
    parser.add_argument("--size", default="1400,900", help="window width,height in pixels")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("dashboard_screenshot: error: expected Chromium on PATH; apt-get install -y chromium")
    width, height = (int(v) for v in args.size.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as results:
        process, url = start_sweep(Path(results), args.steps)
        try:
            headers = auth_headers()
            proxy = start_proxy(url, headers)
            time.sleep(10)  # a few more reports reach the gauges
            for page in PAGES:
                screenshot(chromium, f"http://127.0.0.1:{proxy.server_port}/#/{page}", out / f"{page}.png", width,
                           height)
            (out / "calsweep_metrics.txt").write_text(calsweep_metrics(url, headers))
            proxy.shutdown()
        finally:
            os.killpg(process.pid, signal.SIGINT)  # Tune stops its trials and Ray shuts down
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    report = {"url": url, "token_auth": bool(headers), "pages": [f"{page}.png" for page in PAGES],
              "date": time.strftime("%Y-%m-%d"),
              "chromium": subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()}
    (out / "dashboard.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
