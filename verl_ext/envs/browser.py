"""Headless Debian Chromium driven through Selenium: one browser per env, GUI primitives as
trusted input events (Chrome DevTools ``Input.*``), and every driver failure mapped to an
:class:`EnvFault` (crash / hang / page error) or an :class:`ActionError` (the policy's fault).

Input goes through CDP rather than WebDriver's element commands: a WebDriver click costs ~60 ms
here (it waits for navigation and actionability), a CDP mouse press/release pair ~13 ms, and both
produce trusted events. Nothing is downloaded at run time: the binaries come from apt
(``chromium``, ``chromium-driver``) or ``VERL_EXT_CHROMIUM`` / ``VERL_EXT_CHROMEDRIVER``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl_ext.envs.core import ActionError, EnvFault
from verl_ext.waits import check_timeout

# where a browser env's driver-command bound is set in training (hybrid_gui_tool's kwargs)
COMMAND_TIMEOUT_KEY = "agent loop kwarg env_options.command_timeout_s"

# Flags that work for headless Chromium as root on a CPU-only box, plus two that keep every
# request on the machine: no DNS for anything but localhost, and a dead proxy for the rest
# (Chromium bypasses proxies for loopback by default, so a loopback server still works).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--mute-audio",
    # Fewer processes per browser (~730 MB instead of ~1 GB summed RSS; same unique memory).
    "--no-zygote",
    "--in-process-gpu",
    "--renderer-process-limit=1",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
)
_BINARIES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")
_DRIVERS = ("/usr/bin/chromedriver", "chromedriver", "/usr/lib/chromium/chromedriver")
_OBSERVE_JS = (Path(__file__).parent / "static" / "observe.js").read_text(encoding="utf-8")
# key name -> (windowsVirtualKeyCode, DOM code, text the key inserts)
_KEYS = {
    "Enter": (13, "Enter", "\r"), "Tab": (9, "Tab", ""), "Escape": (27, "Escape", ""),
    "Backspace": (8, "Backspace", ""), "Delete": (46, "Delete", ""), "ArrowUp": (38, "ArrowUp", ""),
    "ArrowDown": (40, "ArrowDown", ""), "ArrowLeft": (37, "ArrowLeft", ""), "ArrowRight": (39, "ArrowRight", ""),
    "Space": (32, "Space", " "),
}
_CENTER_OF_ELEMENT_JS = """
var el = document.querySelector('[data-eid="' + arguments[0] + '"]');
if (!el) return null;
el.scrollIntoView({block: 'nearest', inline: 'nearest'});
var r = el.getBoundingClientRect();
return [r.left + r.width / 2, r.top + r.height / 2, el.tagName];
"""
_FOCUS_AND_SELECT_JS = """
var el = document.querySelector('[data-eid="' + arguments[0] + '"]');
if (!el) return false;
el.focus();
if (typeof el.select === 'function') el.select();
else if (el.isContentEditable) { var r = document.createRange(); r.selectNodeContents(el);
  var s = window.getSelection(); s.removeAllRanges(); s.addRange(r); }
return document.activeElement === el;
"""
_SELECT_OPTION_JS = """
var el = document.querySelector('[data-eid="' + arguments[0] + '"]');
if (!el) return 'missing';
if (el.tagName !== 'SELECT') return 'not a drop-down';
var want = String(arguments[1]).trim().toLowerCase();
for (var i = 0; i < el.options.length; i++) {
  var o = el.options[i];
  if (o.text.trim().toLowerCase() === want || o.value.trim().toLowerCase() === want) {
    el.focus(); el.selectedIndex = i;
    el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true}));
    return 'ok';
  }
}
return 'no option ' + JSON.stringify(arguments[1]);
"""

_LIVE: weakref.WeakSet[Browser] = weakref.WeakSet()


def find_chromium() -> tuple[str, str]:
    """(browser binary, chromedriver) paths; :class:`EnvFault` ``setup_error`` naming the fix if absent."""

    def first(env: str, candidates: tuple[str, ...]) -> str | None:
        if os.environ.get(env):
            return os.environ[env]
        for candidate in candidates:
            found = candidate if os.path.isabs(candidate) and os.path.exists(candidate) else shutil.which(candidate)
            if found:
                return found
        return None

    binary, driver = first("VERL_EXT_CHROMIUM", _BINARIES), first("VERL_EXT_CHROMEDRIVER", _DRIVERS)
    if not binary or not driver:
        raise EnvFault("setup_error", "Chromium or chromedriver not found: `apt-get install -y chromium "
                                      "chromium-driver` or set VERL_EXT_CHROMIUM and VERL_EXT_CHROMEDRIVER")
    return binary, driver


def chromium_missing_reason() -> str | None:
    """Why browser envs cannot run here (None when they can): for pytest skips and ``doctor``."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed: pip install 'verl-ext[gui]'"
    try:
        find_chromium()
    except EnvFault as fault:
        return fault.message
    return None


# A profile folder is named after the process that started its browser, so a later start can tell
# a browser whose owner is gone (a Ray worker killed with SIGKILL never reaches atexit).
PROFILE_PREFIX = "verl_ext_chromium_"


def _profile_owner(profile: str) -> int | None:
    """The owner's pid in ``<tmp>/verl_ext_chromium_<pid>_<random>``; None for other folders."""
    name = os.path.basename(profile.rstrip("/"))
    pid = name[len(PROFILE_PREFIX) :].split("_", 1)[0] if name.startswith(PROFILE_PREFIX) else ""
    return int(pid) if pid.isdigit() and os.path.dirname(profile.rstrip("/")) == tempfile.gettempdir() else None


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap_orphaned_browsers() -> int:
    """Kills the browsers (with their chromedriver) whose owning process is gone and deletes their
    profiles, and the profiles of gone owners that no browser uses; returns how many profiles.
    ``Browser.start`` calls it, so a crashed worker's browsers live until the next one starts."""
    import psutil

    orphans: dict[str, list[psutil.Process]] = {
        str(path): [] for path in Path(tempfile.gettempdir()).glob(f"{PROFILE_PREFIX}*")
        if (owner := _profile_owner(str(path))) is not None and not _running(owner)
    }
    for proc in psutil.process_iter(["cmdline"]):
        profile = next((a.split("=", 1)[1] for a in proc.info["cmdline"] or () if a.startswith("--user-data-dir=")), None)
        owner = None if profile is None else _profile_owner(profile)
        if owner is not None and not _running(owner):
            orphans.setdefault(profile, []).append(proc)
    for profile, browsers in orphans.items():
        doomed: set[psutil.Process] = set()
        for proc in browsers:
            with contextlib.suppress(psutil.Error):
                doomed.update([proc, *proc.children(recursive=True)])
                parent = proc.parent()
                if parent is not None and "chromedriver" in parent.name():
                    doomed.add(parent)
        for proc in doomed:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
    return len(orphans)


class Browser:
    """One headless Chromium + chromedriver pair. Not thread-safe: one env uses it at a time.

    Args:
        command_timeout_s: bound on each driver command (page load, script, the driver's HTTP
            call); a command past it is a ``driver_timeout`` fault.
        env: the env's name, for fault messages.
    """

    def __init__(self, width: int = 1024, height: int = 768, command_timeout_s: float = 30.0, env: str = "browser"):
        check_timeout(COMMAND_TIMEOUT_KEY, command_timeout_s)
        self.width, self.height = width, height
        self.command_timeout_s = command_timeout_s
        self.env = env
        self.driver: Any = None
        self._profile: str | None = None

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> Browser:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        binary, driver_path = find_chromium()
        reap_orphaned_browsers()
        self._profile = tempfile.mkdtemp(prefix=f"{PROFILE_PREFIX}{os.getpid()}_")
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*CHROMIUM_FLAGS, f"--window-size={self.width},{self.height}", f"--user-data-dir={self._profile}"):
            options.add_argument(flag)
        try:
            self.driver = webdriver.Chrome(options=options, service=Service(driver_path, log_output=os.devnull))
        except Exception as exc:  # noqa: BLE001 - any start failure is an env fault, with its cause
            self.close()
            raise EnvFault("browser_crash", f"chromium failed to start: {exc}") from exc
        # A hung renderer (endless JS loop) would otherwise block a command for 120 s.
        self.driver.command_executor.client_config.timeout = self.command_timeout_s
        self.driver.set_page_load_timeout(self.command_timeout_s)
        self.driver.set_script_timeout(self.command_timeout_s)
        _LIVE.add(self)
        # --window-size sizes the window, not the page: without this the viewport (and every
        # screenshot) is shorter than `height` and click_at points near the bottom miss the page.
        self.cdp("Emulation.setDeviceMetricsOverride",
                 {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        return self

    def pids(self) -> list[int]:
        """chromedriver and every process under it (the browser, its renderers, helpers)."""
        import psutil

        process = getattr(getattr(getattr(self.driver, "service", None), "process", None), "pid", None)
        if process is None:
            return []
        try:
            root = psutil.Process(process)
            return [root.pid] + [child.pid for child in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def memory_bytes(self, kind: str = "rss") -> int:
        """Summed ``rss`` (or ``pss``/``uss``, slower) of this browser's processes."""
        import psutil

        total = 0
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                info = psutil.Process(pid).memory_full_info() if kind != "rss" else psutil.Process(pid).memory_info()
                total += getattr(info, kind)
        return total

    def kill_browser(self) -> None:
        """SIGKILL the browser processes but not chromedriver: what a renderer/browser crash looks like."""
        for pid in self.pids()[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def alive(self) -> bool:
        if self.driver is None:
            return False
        try:
            self.js("return 1")
            return True
        except EnvFault:
            return False

    def close(self) -> None:
        """Kill the browser, quit the driver, delete the profile. Safe to call twice.

        The browser is killed first: a graceful quit waits on a hung renderer for tens of seconds,
        and nothing in the profile is worth flushing (it is deleted).
        """
        pids = self.pids() if self.driver is not None else []
        self.kill_browser()
        if self.driver is not None:
            with contextlib.suppress(Exception):
                self.driver.quit()
            self.driver = None
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._profile:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None
        _LIVE.discard(self)

    # --- driver calls, faults mapped ----------------------------------------------------------
    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        from selenium.common.exceptions import JavascriptException, TimeoutException, WebDriverException

        if self.driver is None:
            raise EnvFault("browser_crash", f"{what}: the browser is not running")
        try:
            yield
        except (ActionError, EnvFault):
            raise
        except TimeoutException as exc:
            raise self._timeout(what, exc.msg) from exc
        except JavascriptException as exc:
            raise EnvFault("page_error", f"{what}: {exc.msg}") from exc
        except WebDriverException as exc:
            message = (exc.msg or str(exc)).splitlines()[0]
            kind = "page_error" if "net::ERR_" in message else "browser_crash"  # a failed navigation
            raise EnvFault(kind, f"{what}: {message}") from exc
        except (TimeoutError, OSError) as exc:  # socket timeouts, refused connections (driver gone)
            if isinstance(exc, TimeoutError) or "timed out" in str(exc):
                raise self._timeout(what, str(exc)) from exc
            raise EnvFault("browser_crash", f"{what}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - urllib3 errors etc.: the driver link is broken
            if "timeout" in type(exc).__name__.lower():
                raise self._timeout(what, f"{type(exc).__name__}: {exc}") from exc
            raise EnvFault("browser_crash", f"{what}: {type(exc).__name__}: {exc}") from exc

    def _timeout(self, what: str, detail: str) -> EnvFault:
        return EnvFault("driver_timeout", f"Chromium for env {self.env}: {what} did not finish within "
                                          f"{self.command_timeout_s:g} s ({COMMAND_TIMEOUT_KEY}): {detail}")

    def js(self, script: str, *args: Any) -> Any:
        with self._guard("script"):
            return self.driver.execute_script(script, *args)

    def cdp(self, command: str, params: dict[str, Any]) -> Any:
        with self._guard(command):
            return self.driver.execute_cdp_cmd(command, params)

    def get(self, url: str) -> None:
        with self._guard("navigate"):
            self.driver.get(url)

    def screenshot(self) -> bytes:
        with self._guard("screenshot"):
            return self.driver.get_screenshot_as_png()

    def observe(self, root_selector: str = "body", status_js: str = "") -> dict[str, Any]:
        """Title, element list and ``status_js``'s return value, in one round trip (``static/observe.js``)."""
        return self.js(_OBSERVE_JS, root_selector, status_js)

    # --- GUI primitives ---------------------------------------------------------------------
    def _center(self, element: int) -> tuple[float, float, str]:
        found = self.js(_CENTER_OF_ELEMENT_JS, int(element))
        if not found:
            raise ActionError(f"no element [{element}] on the page; use ids from the latest observation")
        return found[0], found[1], found[2]

    def _mouse(self, x: float, y: float, event: str = "click", **extra: Any) -> None:
        if not (0 <= x <= self.width and 0 <= y <= self.height):
            raise ActionError(f"point ({x:.0f}, {y:.0f}) is outside the {self.width}x{self.height} viewport")
        if event == "click":
            for kind in ("mousePressed", "mouseReleased"):
                self.cdp("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
        else:
            self.cdp("Input.dispatchMouseEvent", {"type": event, "x": x, "y": y, **extra})

    def click(self, element: int) -> None:
        x, y, tag = self._center(element)
        if tag == "SELECT":
            raise ActionError(f"[{element}] is a drop-down: use select(element, text)")
        self._mouse(x, y)

    def click_at(self, x: int, y: int) -> None:
        self._mouse(float(x), float(y))

    def type(self, element: int, text: str) -> None:
        """Replace the field's text: focus, select all, insert (an empty text deletes the selection)."""
        if not self.js(_FOCUS_AND_SELECT_JS, int(element)):
            raise ActionError(f"[{element}] is not on the page or cannot take text")
        if text:
            self.cdp("Input.insertText", {"text": text})
        else:
            self.key("Delete")

    def select(self, element: int, option: str) -> None:
        outcome = self.js(_SELECT_OPTION_JS, int(element), option)
        if outcome == "missing":
            raise ActionError(f"no element [{element}] on the page; use ids from the latest observation")
        if outcome != "ok":
            raise ActionError(f"[{element}]: {outcome}")

    def key(self, name: str) -> None:
        if name not in _KEYS:
            raise ActionError(f"unknown key {name!r}; known: {sorted(_KEYS)}")
        code, dom_code, text = _KEYS[name]
        key = " " if name == "Space" else name
        base = {"key": key, "code": dom_code, "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code}
        self.cdp("Input.dispatchKeyEvent", {"type": "keyDown" if text else "rawKeyDown", "text": text, **base})
        self.cdp("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def scroll(self, direction: str, element: int | None = None) -> None:
        x, y = (self.width / 2, self.height / 2) if element is None else self._center(element)[:2]
        self._mouse(x, y, "mouseWheel", deltaX=0, deltaY=400 if direction == "down" else -400)


@atexit.register
def _close_all() -> None:
    """Browsers never outlive the process that started them (short of SIGKILL: ``reap_orphaned_browsers``)."""
    for browser in list(_LIVE):
        browser.close()
