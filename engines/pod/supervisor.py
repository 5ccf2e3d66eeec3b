"""A supervisor around tritonserver: heals a voice whose backend process died, drains on
SIGTERM/SIGINT, and answers the pod's readiness and liveness.

Why a restart: when a Python-backend stub dies (for a voice run as several instances, any one
of them), Triton (2.51) keeps the model READY, answers every new request sent to that stub
with "Stub process ... is not healthy" and never ends the streams that were in flight;
unloading the model leaves those requests held, so even a clean shutdown then waits out the
exit timeout. Killing tritonserver (and its stubs) closes every gRPC stream with UNAVAILABLE
at once, and a fresh server loads the voices again: from the model
repository on disk (`voxfleet serve`), or, for voices the operator loaded through the
repository API, from the configuration the supervisor read from Triton when they loaded.

Readiness (GET /ready on the health port) is 200 only while Triton is ready, every voice it
has loaded is ready, no heal is under way and the server is not draining. Liveness (GET
/live) is 200 while the supervisor's loop runs; a heal that cannot finish ends the process
with an error, so the kubelet restarts the container.

On SIGTERM or SIGINT (handlers installed whatever was inherited) the server drains: readiness
fails, new streams are refused with UNAVAILABLE (the stream model checks the drain file),
streams in flight finish for up to Triton's exit timeout, and tritonserver is stopped as
soon as none is left. Killed outright (SIGKILL, an out-of-memory kill), it takes tritonserver
with it: Linux sends tritonserver SIGTERM when its parent dies (`ended_with_this_process`), so
that no server is left holding the ports and the GPU's memory.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from engines.contract import names
from engines.contract.repository import MODEL_SOURCE, instance_count, stream_model_source
from engines.pod.mps import MpsDaemon
from engines.pod.processes import end_process_group, ended_with_this_process, exit_status
from engines.pod.voice_host.process import HostOptions, VoiceHostError, VoiceHostProcess

STUB_NAME = "triton_python_backend_stub"
WATCH_INTERVAL_S = 0.1
READY_CHECK_INTERVAL_S = 0.5
# A heal (server restarted, every voice loaded again) that takes longer ends the supervisor.
HEAL_TIMEOUT_S = 120.0
# After the last stream ends, wait this long for none to start (a request being phonemised
# is not yet in the gauge) before stopping tritonserver.
DRAIN_SETTLE_S = 0.5
# tritonserver with no stream left exits in about 3 s. Triton 2.51 now and then keeps a model
# whose streams have all ended (seen after clients cancelled streams that had finished) and
# waits out its whole exit timeout: with nothing left to lose, it is killed after this long.
STOP_TIMEOUT_S = 5.0
DEFAULT_EXIT_TIMEOUT_S = 30.0
_LIVE_STREAMS = re.compile(rf"^{names.LIVE_STREAMS}\{{[^}}]*\}} ([0-9.e+-]+)$", re.M)


@dataclass(frozen=True)
class TritonEndpoints:
    """What the supervisor needs to know of tritonserver's arguments."""

    http_port: int = 8000
    metrics_port: int = 8002
    exit_timeout_s: float = DEFAULT_EXIT_TIMEOUT_S
    # The header that opens the repository API, where it is restricted (name, value).
    repository_header: tuple[str, str] | None = None

    @classmethod
    def from_args(cls, args: Sequence[str]) -> TritonEndpoints:
        values: dict[str, str] = {}
        items = list(args)
        for index, arg in enumerate(items):
            if not arg.startswith("--"):
                continue
            if "=" in arg:
                key, value = arg[2:].split("=", 1)
            elif index + 1 < len(items) and not items[index + 1].startswith("--"):
                key, value = arg[2:], items[index + 1]
            else:
                continue
            values[key] = value
        header = None
        restricted = values.get("http-restricted-api", "")
        apis, _, key_value = restricted.partition(":")
        if "model-repository" in apis.split(",") and "=" in key_value:
            name, value = key_value.split("=", 1)
            header = (name, value)
        return cls(
            http_port=int(values.get("http-port", 8000)),
            metrics_port=int(values.get("metrics-port", 8002)),
            exit_timeout_s=float(values.get("exit-timeout-secs", DEFAULT_EXIT_TIMEOUT_S)),
            repository_header=header,
        )


@dataclass
class _Stub:
    model: str
    shm_region: str


@dataclass
class _State:
    ready: bool = False
    reason: str = "starting"
    draining: bool = False
    healing: bool = False
    last_tick: float = field(default_factory=time.monotonic)
    restarts: dict[str, int] = field(default_factory=dict)


def stub_of(process: psutil.Process) -> _Stub | None:
    """The model a Python-backend stub serves, from its command line
    (stub, model.py, shm region, sizes, parent pid, backend dir, ..., instance name, ...)."""
    try:
        if process.name() != STUB_NAME:
            return None
        cmdline = process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if len(cmdline) < 9:
        return None
    instance = cmdline[8]  # <model>_<group>_<instance>
    parts = instance.rsplit("_", 2)
    return _Stub(model=parts[0] if len(parts) == 3 else instance, shm_region=cmdline[2])


def _still_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie or a vanished one is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class Supervisor:
    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        endpoints: TritonEndpoints,
        work_dir: Path,
        health_port: int | None = names.HEALTH_PORT,
        health_host: str = "0.0.0.0",
        mps: MpsDaemon | None = None,
        host_options: HostOptions | None = None,
    ) -> None:
        self.command = command
        self.env = env
        self.endpoints = endpoints
        self.work_dir = work_dir
        self.drain_file = work_dir / "draining"
        self.health_port = health_port
        self.health_host = health_host
        self.state = _State()
        self.process: subprocess.Popen[bytes] | None = None
        self._stubs: dict[int, _Stub] = {}
        # Voices loaded through the repository API: their config, to load them again.
        self._configs: dict[str, dict[str, Any]] = {}
        self._pending_config: set[str] = set()
        self._stop = threading.Event()
        self._health: ThreadingHTTPServer | None = None
        # A CUDA MPS daemon tritonserver's backend processes share the GPU through
        # (engines/pod/mps.py).
        self.mps = mps
        # The voice host the stream models run their voices on (engines/pod/voice_host): started
        # before tritonserver, and again (with it) if it dies.
        self.host_options = host_options or HostOptions()
        self.host = VoiceHostProcess(work_dir, env, self.host_options)
        self._host_client: Any = None

    # -- tritonserver ---------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.endpoints.http_port}"

    def _http(self, method: str, path: str, body: bytes | None = None, timeout: float = 2.0) -> int:
        return self._http_read(method, path, body, timeout)[0]

    def _http_read(
        self, method: str, path: str, body: bytes | None = None, timeout: float = 2.0
    ) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{self.http_url}{path}", data=body, method=method)
        if self.endpoints.repository_header and path.startswith("/v2/repository"):
            request.add_header(*self.endpoints.repository_header)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return 0, b""

    def _start_host(self) -> None:
        self.host = VoiceHostProcess(self.work_dir, self.env, self.host_options)
        self.host.start()

    def _start_triton(self) -> None:
        self.drain_file.unlink(missing_ok=True)
        env = self.host.tritonserver_env(
            {
                **self.env,
                names.DRAIN_FILE_ENV: str(self.drain_file),
                names.RESTARTS_ENV: json.dumps(self.state.restarts),
            }
        )
        # Started from the main thread (start, run): it ends with this process.
        self.process = subprocess.Popen(
            ended_with_this_process(list(self.command)), env=env, start_new_session=True
        )
        self._stubs = {}

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for tritonserver's own readiness; False if it exited or the time ran out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            if self.process is None or exit_status(self.process) is not None:
                return False
            if self._http("GET", "/v2/health/ready") == 200:
                # Watched from the moment the server is ready: a stub that dies before the
                # watch loop's first look is a death, not a stub never seen.
                self._stubs = {**self._stubs, **self._current_stubs()}
                self._pending_config.update(stub.model for stub in self._stubs.values())
                return True
            time.sleep(0.1)
        return False

    def _kill_triton(self) -> None:
        """Kill tritonserver and every process of its group, its backend stubs with it, even
        where it exited by itself: a stub can outlive its server (processes.py says how)."""
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            end_process_group(process)
        self._remove_shared_memory()

    def _remove_shared_memory(self) -> None:
        # A killed stub leaves its shared-memory region behind.
        for stub in self._stubs.values():
            Path("/dev/shm", stub.shm_region).unlink(missing_ok=True)
        self._stubs = {}

    def _model_ready(self, model: str) -> bool:
        return self._http("GET", f"/v2/models/{model}/ready") == 200

    # -- watching ---------------------------------------------------------------------------
    def _current_stubs(self) -> dict[int, _Stub]:
        assert self.process is not None
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        found = {}
        for child in children:
            stub = stub_of(child)
            if stub is not None:
                found[child.pid] = stub
        return found

    def _instance_count(self, model: str) -> int | None:
        """The stream-model instances Triton runs for `model` by its config (None: no answer)."""
        status, body = self._http_read("GET", f"/v2/models/{model}/config")
        if status != 200:
            return None
        try:
            return instance_count(json.loads(body))
        except (ValueError, AttributeError, TypeError):
            return None

    def _dead_model(self) -> str | None:
        """A voice whose stub died while Triton still holds it loaded, if any."""
        current = self._current_stubs()
        alive = Counter(stub.model for stub in current.values())
        dead = None
        undecided: dict[int, _Stub] = {}
        for pid, stub in self._stubs.items():
            if pid in current:
                continue
            if _still_running(pid):
                undecided[pid] = stub  # missed by this listing (a busy read): not a death
                continue
            if stub.model in alive:
                # A reload starts the new stubs before the old ones end; with several
                # instances, one that died leaves the voice fewer than its config runs.
                configured = self._instance_count(stub.model)
                if configured is None:
                    undecided[pid] = stub  # no answer: ask again next time
                    continue
                if alive[stub.model] >= configured:
                    continue
            status = self._http("GET", f"/v2/models/{stub.model}/ready")
            if status == 200:
                dead = stub.model
            elif status == 0:
                undecided[pid] = stub  # no answer (a busy server): ask again next time
            else:  # unloaded on purpose
                self._configs.pop(stub.model, None)
                self._pending_config.discard(stub.model)
        for pid, stub in current.items():
            if pid not in self._stubs:
                self._pending_config.add(stub.model)  # loaded or reloaded: read its config
        if dead is not None:  # keep the dead stub's shared memory to remove
            self._stubs = {**self._stubs, **current}
        else:
            self._stubs = {**current, **undecided}
        return dead

    def _read_configs(self) -> None:
        for model in list(self._pending_config):
            if not self._model_ready(model):
                continue
            status, body = self._http_read("GET", f"/v2/models/{model}/config")
            if status == 200:
                self._configs[model] = json.loads(body)
                self._pending_config.discard(model)

    def _check_ready(self) -> None:
        state = self.state
        if state.draining:
            state.ready, state.reason = False, "draining"
        elif state.healing:
            state.ready, state.reason = False, "restarting the server to heal a voice"
        elif self._http("GET", "/v2/health/ready") != 200:
            state.ready, state.reason = False, "tritonserver is not ready"
        else:
            missing = [model for model in self._configs if not self._model_ready(model)]
            if missing:
                # A voice the operator is unloading, or has unloaded, is not missing: its last
                # streams end while the pod's other voices keep serving.
                for model in self._unloaded_on_purpose():
                    if model in missing:
                        missing.remove(model)
                        if not self._model_ready(model):
                            self._configs.pop(model, None)
            state.ready = not missing
            state.reason = f"not ready: {', '.join(missing)}" if missing else "ready"

    def _unloaded_on_purpose(self) -> set[str]:
        """Models the repository index lists as unloading or unloaded (empty if unreadable)."""
        status, body = self._http_read("POST", "/v2/repository/index", b"{}")
        if status != 200:
            return set()
        try:
            entries = json.loads(body)
        except ValueError:
            return set()
        return {
            str(entry.get("name"))
            for entry in entries
            if isinstance(entry, dict)
            and (
                entry.get("state") == "UNLOADING"
                or (entry.get("state") == "UNAVAILABLE" and entry.get("reason") == "unloaded")
            )
        }

    # -- healing ----------------------------------------------------------------------------
    def _heal(self, cause: str, model: str | None) -> bool:
        state = self.state
        state.healing, state.ready = True, False
        if model is not None:
            state.restarts[model] = state.restarts.get(model, 0) + 1
        print(f"voxfleet: {cause}; restarting tritonserver", flush=True)
        started = time.monotonic()
        # A voice loaded since the last readiness check has no configuration here yet; the
        # old server still holds it (a model whose stub died stays READY), so read it now or
        # the new server would come up without that voice.
        self._read_configs()
        self._kill_triton()
        if not self.host.alive():
            # The voices' weights went with it: a new host, and every voice loaded again.
            self.host.kill()
            try:
                self._start_host()
            except VoiceHostError as error:
                print(f"voxfleet: the voice host did not start again: {error}", flush=True)
                return False
        self._start_triton()
        if not self.wait_ready(HEAL_TIMEOUT_S):
            return False
        for voice, config in self._configs.items():
            if self._model_ready(voice):
                continue  # loaded from the repository on disk
            body = json.dumps(
                {
                    "parameters": {
                        "config": json.dumps(config),
                        f"file:{MODEL_SOURCE}": base64.b64encode(stream_model_source()).decode(),
                    }
                }
            ).encode()
            remaining = max(1.0, HEAL_TIMEOUT_S - (time.monotonic() - started))
            status, reply = self._http_read(
                "POST", f"/v2/repository/models/{voice}/load", body, timeout=remaining
            )
            if status != 200:
                print(f"voxfleet: loading {voice} again failed ({status}): {reply!r}", flush=True)
                return False
        self._stubs = self._current_stubs()
        state.healing = False
        print(f"voxfleet: healed in {time.monotonic() - started:.1f} s", flush=True)
        return True

    # -- draining ---------------------------------------------------------------------------
    def live_streams(self) -> float | None:
        url = f"http://127.0.0.1:{self.endpoints.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None
        return sum(float(value) for value in _LIVE_STREAMS.findall(text))

    def _drain_and_stop(self) -> int:
        state = self.state
        state.draining, state.ready = True, False
        self.drain_file.touch()
        deadline = time.monotonic() + self.endpoints.exit_timeout_s
        idle_since: float | None = None
        while self.process is not None and exit_status(self.process) is None:
            now = time.monotonic()
            state.last_tick = now  # still live while it drains
            if now >= deadline:
                break
            live = self.live_streams()
            if live is None or live > 0:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= DRAIN_SETTLE_S:
                break
            time.sleep(0.05)
        return self._stop_triton()

    def _stop_triton(self) -> int:
        process = self.process
        if process is None:
            return 0
        if process.returncode is None:
            end_process_group(process, signal.SIGINT, STOP_TIMEOUT_S)
        self._remove_shared_memory()
        self.host.stop()
        return 0

    # -- the health port --------------------------------------------------------------------
    def _serve_health(self) -> None:
        if self.health_port is None:
            return
        supervisor = self

        class Health(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state = supervisor.state
                if self.path == names.READY_PATH:
                    ok, text = state.ready, state.reason
                    process = supervisor.process
                    if ok and (process is None or exit_status(process) is not None):
                        # Not only at the next poll (every 0.1 s): no listener is sent to a
                        # server whose tritonserver has already gone.
                        ok, text = False, "tritonserver is not running"
                elif self.path == names.LIVE_PATH:
                    ok = state.healing or time.monotonic() - state.last_tick < 10
                    text = "live" if ok else "the supervisor is stuck"
                elif self.path in (names.MEMORY_PATH, "/metrics"):
                    report = supervisor.memory()
                    ok = report is not None
                    if report is None:
                        text = "the voice host does not answer"
                    elif self.path == names.MEMORY_PATH:
                        text = json.dumps(report)
                    else:
                        text = memory_metrics(report)
                else:
                    ok, text = False, "not found"
                body = (text + "\n").encode()
                self.send_response(200 if ok else (404 if text == "not found" else 503))
                kind = "application/json" if self.path == names.MEMORY_PATH and ok else "text/plain"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._health = ThreadingHTTPServer((self.health_host, self.health_port), Health)
        self._health.daemon_threads = True
        threading.Thread(
            target=self._health.serve_forever, name="voxfleet-health", daemon=True
        ).start()

    def memory(self) -> dict[str, Any] | None:
        """The voice host's memory report (engines.pod.voice_host.host.MemoryReport.to_dict), with
        the resident memory of tritonserver and its stream models in `server_rss_mib`; None
        where the host does not answer."""
        from engines.pod.voice_host.client import HostClient, HostError

        try:
            client = self._host_client
            if client is None or not client.connected:
                client = self._host_client = HostClient(self.host.socket_path, 2.0)
            report = client.memory()
        except HostError:
            self._host_client = None
            return None
        report["server_rss_mib"] = round(self._server_rss() / (1 << 20), 1)
        return report

    def _server_rss(self) -> int:
        process = self.process
        if process is None:
            return 0
        total = 0
        try:
            parent = psutil.Process(process.pid)
            for member in [parent, *parent.children(recursive=True)]:
                try:
                    total += member.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        except psutil.NoSuchProcess:
            return 0
        return total

    # -- the whole life ---------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGINT and SIGTERM drain and stop, whatever this process inherited (a background
        job of a script starts with SIGINT ignored)."""

        def request_stop(signum: int, _frame: object) -> None:
            self._stop.set()

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)

    def start(self) -> None:
        """Start the MPS daemon (if any), the health port and tritonserver; MpsError (a
        TritonError) or OSError where one of them cannot start."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.mps is not None:
            self.mps.start()
            self.env = {**self.env, **self.mps.env}
            print(f"voxfleet: backends share the GPU through MPS ({self.mps.pipe_dir})", flush=True)
        try:
            self._serve_health()
        except OSError:
            self._stop_mps()
            raise
        try:
            self._start_host()
        except VoiceHostError as error:
            self._close_health()
            self._stop_mps()
            raise OSError(str(error)) from None
        self._start_triton()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Watch until a signal; returns the exit status."""
        assert self.process is not None, "start() first"
        next_ready_check = 0.0
        try:
            while not self._stop.is_set():
                self.state.last_tick = time.monotonic()
                code = exit_status(self.process)
                if code is not None:
                    if not self._heal(f"tritonserver exited with {code}", None):
                        return self._give_up()
                    continue
                if not self.host.alive():
                    cause = f"the voice host exited with {self.host.returncode}"
                    if not self._heal(cause, None):
                        return self._give_up()
                    continue
                dead = self._dead_model()
                if dead is not None:
                    if not self._heal(f"the backend process of voice {dead!r} died", dead):
                        return self._give_up()
                    continue
                now = time.monotonic()
                if now >= next_ready_check:
                    self._read_configs()
                    self._check_ready()
                    next_ready_check = now + READY_CHECK_INTERVAL_S
                self._stop.wait(WATCH_INTERVAL_S)
            return self._drain_and_stop()
        finally:
            self._close_health()
            self._stop_mps()

    def run_down(self) -> None:
        """Kill tritonserver, stop the MPS daemon and close the health port (a start that
        failed)."""
        self._kill_triton()
        self.host.stop()
        self._stop_mps()
        self._close_health()

    def _close_health(self) -> None:
        if self._health is not None:
            self._health.shutdown()
            self._health.server_close()
            self._health = None

    def _stop_mps(self) -> None:
        if self.mps is not None:
            self.mps.stop()

    def _give_up(self) -> int:
        if self._stop.is_set():
            return self._drain_and_stop()
        print("voxfleet: could not heal the server; exiting", flush=True)
        self._kill_triton()
        self.host.stop()
        return 1


def memory_metrics(report: dict[str, Any]) -> str:
    """A memory report in Prometheus' text format (the health port's /metrics)."""
    mib = 1 << 20
    device = report.get("device", "cpu")
    lines = []
    for name, key, help_text in (
        (names.MEMORY_TOTAL_BYTES, "total_mib", "Memory the pod places voices in"),
        (names.MEMORY_USED_BYTES, "used_mib", "Memory the pod's voice host uses"),
        (names.MEMORY_FIXED_BYTES, "fixed_mib", "Used memory that is no voice's own"),
    ):
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} gauge",
            f'{name}{{device="{device}"}} {float(report.get(key, 0)) * mib:.0f}',
        ]
    lines += [
        f"# HELP {names.VOICE_MEMORY_BYTES} Memory a voice's weights and state take",
        f"# TYPE {names.VOICE_MEMORY_BYTES} gauge",
    ]
    for voice, entry in sorted(report.get("voices", {}).items()):
        lines.append(
            f'{names.VOICE_MEMORY_BYTES}{{{names.MODEL_LABEL}="{voice}",device="{device}"}} '
            f"{float(entry['mib']) * mib:.0f}"
        )
    return "\n".join(lines)
