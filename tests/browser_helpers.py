"""A real JupyterLab server and the clicks a learner makes in it, for tests/notebooks/test_browser.py.

Why a browser at all: nbclient (tests/notebooks/test_notebooks.py) proves the notebooks run in a
kernel, but not that they work where the course is read: JupyterLab's Run menu, its
stop button, its live output area and its image renderer. These helpers drive Debian's
Chromium through Playwright; the selectors are JupyterLab 4's command ids
(``data-command``), which survive menu relabelling and translations, not visible text.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddp_lab.tools.notebook_runner import kernel_env

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
IN_CI = os.environ.get("CI", "").lower() == "true"
# The notebook test_browser.py runs with Run All (test_notebooks.py then skips its headless run).
NOTEBOOK_00 = "00_launching_from_jupyter.ipynb"

# JupyterLab settings for a test session, keyed by plugin file under user_settings_dir.
# windowingMode "none": every cell stays in the DOM, so "no [*] prompt left" and "an
# image was rendered" see the whole notebook, not just what is scrolled into view
# (https://jupyterlab.readthedocs.io/en/latest/user/notebook.html, "windowing mode").
# fetchNews off: the "official Jupyter news?" toast would cover part of the screenshot.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}


def missing_requirements() -> list[str]:
    """What this machine lacks for a browser test (see .ci/run for how CI installs it)."""
    missing = [] if CHROMIUM.exists() else [f"{CHROMIUM} (apt-get install chromium)"]
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append('the playwright package (pip install -e ".[dev]")')
    return missing


@dataclass(frozen=True)
class Lab:
    """A running ``jupyter lab`` serving ``root`` on ``url`` behind ``token``."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen
    log: Path
    sockets: Path   # the kernels' connection files and Unix sockets; removed by stop_lab

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}"

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.url}/api/{path}?token={self.token}", timeout=5) as r:
            return json.load(r)


def free_port() -> int:
    """A port the OS just saw free; jupyter runs with port_retries=0, so a race fails loudly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(folder: Path) -> None:
    for name, values in LAB_SETTINGS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(values))


def _server_env(home: Path, runtime: Path) -> dict[str, str]:
    """kernel_env() (this checkout on PYTHONPATH) with Jupyter's per-user state in ``home``.

    Why: a user's ~/.jupyter config, ~/.local/share/jupyter kernelspecs (a "python3" there
    would shadow this interpreter's kernel) or IPython startup files must not change what
    the test sees; with them moved away, "python3" is ipykernel's spec for sys.executable.
    """
    env = kernel_env()
    if str(ROOT) not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                     ("IPYTHONDIR", "ipython")]:
        env[var] = str(home / sub)
    env["JUPYTER_RUNTIME_DIR"] = str(runtime)  # short: kernels' socket paths fit (start_lab)
    return env


def start_lab(root: Path, home: Path) -> Lab:
    """``python -m jupyter lab`` on a free loopback port; returns once /api/status answers."""
    _write_settings(home / "settings")
    port, token = free_port(), secrets.token_hex(16)
    sockets = Path(tempfile.mkdtemp(prefix="ddp-lab-lab-"))
    log = home / "jupyter.log"
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
        f"--port={port}", "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}", "--allow-root",  # CI runs as root
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",  # no layout restored from a past run
        # Unix sockets: no port to lose to another test (notebook_runner.OwnKernel says
        # why), in a folder short enough for a socket's path (under home it is not).
        "--KernelManager.transport=ipc",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=_server_env(home, sockets), cwd=root,
                                   stdout=out, stderr=subprocess.STDOUT)
    lab = Lab(f"http://127.0.0.1:{port}", token, root, process, log, sockets)
    try:
        _wait_until_up(lab, seconds=120)
    except BaseException:
        stop_lab(lab)
        raise
    return lab


def _wait_until_up(lab: Lab, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited ({lab.process.returncode}):\n{log_tail(lab)}")
        try:
            lab.api("status")
            return
        except OSError:
            time.sleep(0.25)
    raise TimeoutError(f"jupyter lab did not answer in {seconds} s:\n{log_tail(lab)}")


def log_tail(lab: Lab, chars: int = 4000) -> str:
    return lab.log.read_text(errors="replace")[-chars:]


def stop_lab(lab: Lab, seconds: float = 30) -> list[str]:
    """Stop the server the way Ctrl-C would; return (and kill) any descendant that survived.

    SIGTERM lets jupyter shut its kernels down, and each kernel's ddp_lab fork server and
    ranks with it. Anything still alive afterwards is an orphan the course promised never
    to leave, so it is reported (the caller fails the test) and then killed.
    """
    try:
        family = psutil.Process(lab.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    lab.process.terminate()
    try:
        lab.process.wait(seconds)
    except subprocess.TimeoutExpired:
        lab.process.kill()
        lab.process.wait(10)
    _, alive = psutil.wait_procs(family, timeout=10)
    shutil.rmtree(lab.sockets, ignore_errors=True)
    leftovers = [_describe(p) for p in alive]
    for process in alive:
        _kill(process)
    return [d for d in leftovers if d]


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid}: {' '.join(process.cmdline())[:200]}"
    except psutil.Error:
        return ""  # exited between the wait and now


def _kill(process: psutil.Process) -> None:
    try:
        process.kill()
    except psutil.NoSuchProcess:
        pass


# ---- the clicks -------------------------------------------------------------------------
# Each wait below has its own timeout so that a hang says which step hung.

KERNEL_STATUS = ".jp-StatusBar-TextItem[title^='Change kernel']"  # "Python 3 (ipykernel) | Idle"
PROMPTS = ".jp-Notebook .jp-CodeCell .jp-InputPrompt"


def open_notebook(page, lab: Lab, name: str, timeout_s: float = 120) -> None:
    """Load the notebook in JupyterLab and wait until its kernel is started and idle."""
    page.goto(lab.notebook_url(name))
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
    wait_kernel_idle(page, timeout_s)


def wait_kernel_idle(page, timeout_s: float) -> None:
    """The status bar reads "<kernel> | Idle": started, connected, and running nothing.

    Why the status bar and not the toolbar's execution indicator: the indicator already
    says "idle" while the status bar still reads "No Kernel | Initializing".
    """
    page.wait_for_function(
        """sel => { const e = document.querySelector(sel);
                    return e && !e.textContent.startsWith('No Kernel')
                             && e.textContent.trim().endsWith('| Idle'); }""",
        arg=KERNEL_STATUS, timeout=timeout_s * 1000)


def menu(page, menu_label: str, command: str) -> None:
    """Click a menu bar entry, then the item bound to ``command`` (e.g. runmenu:run-all)."""
    page.locator(".lm-MenuBar-item", has_text=menu_label).first.click()
    page.locator(f".lm-Menu-item[data-command='{command}']").click()


def toolbar(page, command: str) -> None:
    """Click the notebook toolbar button bound to ``command`` (e.g. notebook:interrupt-kernel)."""
    page.locator(f".jp-NotebookPanel-toolbar jp-button[data-command='{command}']").click()


def run_all(page, timeout_s: float) -> None:
    """Run > Run All Cells, then wait until every queued cell has finished.

    "Finished" is: no prompt reads [*] AND the kernel is idle, both seen after the run
    was seen starting (some prompt left its blank "[ ]:"); without that first wait, the
    check could pass in the instant between the click and JupyterLab queueing the cells.
    Run All stops at a failing cell and blanks the prompts after it, so a failure ends
    the wait too, and the caller's "every cell ran" check reports it.
    """
    menu(page, "Run", "runmenu:run-all")
    page.wait_for_function(
        "sel => [...document.querySelectorAll(sel)].some(p => /\\[\\S+\\]/.test(p.textContent))",
        arg=PROMPTS, timeout=60_000)
    wait_cells_done(page, timeout_s)


def wait_cells_done(page, timeout_s: float) -> None:
    page.wait_for_function(
        "sel => ![...document.querySelectorAll(sel)].some(p => p.textContent.includes('*'))",
        arg=PROMPTS, timeout=timeout_s * 1000)
    wait_kernel_idle(page, timeout_s)


def prompts(page) -> list[str]:
    """The code cells' prompts as shown, e.g. ["[1]:", "[2]:", "[ ]:"]."""
    return [p.replace("\xa0", " ") for p in page.locator(PROMPTS).all_text_contents()]


def save(page, timeout_s: float = 30) -> None:
    """Toolbar save; returns once the tab lost its "unsaved" mark, i.e. the file is written."""
    toolbar(page, "docmanager:save")
    page.wait_for_selector(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty", state="detached",
                           timeout=timeout_s * 1000)


def output_text(page, cell_index: int) -> str:
    """Everything shown in the output area of the ``cell_index``-th cell (0-based, all types)."""
    return page.locator(".jp-Notebook .jp-Cell").nth(cell_index).locator(
        ".jp-OutputArea").inner_text()


def wait_for_output(page, cell_index: int, texts: list[str], timeout_s: float) -> None:
    page.wait_for_function(
        """([i, texts]) => { const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[i];
                             const t = c ? c.querySelector('.jp-OutputArea').innerText : '';
                             return texts.every(x => t.includes(x)); }""",
        arg=[cell_index, texts], timeout=timeout_s * 1000)


def screenshot_whole_notebook(page, path: Path) -> None:
    """A screenshot of the full notebook, not just one screen of it.

    JupyterLab never scrolls the page itself (the notebook panel scrolls inside a fixed
    window), so Playwright's full_page alone gives one screen; the viewport is stretched
    to the notebook's height first, with the file browser closed to leave room for it.
    """
    page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").first.click()
    scroller = ".jp-NotebookPanel .jp-WindowedPanel-outer"
    # Up to the last cell's bottom: scrollHeight would add JupyterLab's scroll-past-end space.
    height = page.evaluate("""sel => { const o = document.querySelector(sel);
        const cells = o.querySelectorAll('.jp-Cell');
        const bottom = cells[cells.length - 1].getBoundingClientRect().bottom;
        return bottom - o.getBoundingClientRect().top + o.scrollTop; }""", scroller)
    chrome = page.viewport_size["height"] - page.locator(scroller).bounding_box()["height"]
    width = page.viewport_size["width"]
    # Chromium cannot capture more than 16384 px in one image.
    page.set_viewport_size({"width": width, "height": min(int(height + chrome) + 40, 16000)})
    page.evaluate(f"document.querySelector('{scroller}').scrollTop = 0")
    page.wait_for_timeout(500)  # one layout pass at the new size
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
