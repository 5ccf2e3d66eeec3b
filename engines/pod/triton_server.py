"""Run a real `tritonserver` (the one bundled in the nvidia-pytriton wheel) on a repository."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from engines.pod.ports import free_port
from engines.pod.processes import end_process_group, ended_with_this_process, exit_status

# Triton waits this long for in-flight requests at shutdown; callers stopping the server give
# it a little more before killing it.
EXIT_TIMEOUT_SECONDS = 30
# Every model voxfleet writes carries its whole config (engines/contract/repository.py). Left
# on, Triton's Python backend starts a stub process at each load only to ask the model to
# complete it: 1.2 to 1.3 s of a 1.9 s voice load on this project's 2-core CPU machine
# (2026-11-29, `python -m lab.packing --runtime onnxruntime`), before the stub that serves.
NO_AUTO_COMPLETE = "--disable-auto-complete-config"


def with_pod_flags(args: list[str]) -> list[str]:
    """tritonserver's arguments with the flags every voxfleet server runs with added."""
    return args if NO_AUTO_COMPLETE in args else [*args, NO_AUTO_COMPLETE]


class TritonError(RuntimeError):
    pass


def tritonserver_dist() -> Path:
    try:
        import pytriton
    except ImportError:
        raise TritonError("nvidia-pytriton is not installed; run `make setup`") from None
    return Path(pytriton.__file__).parent / "tritonserver"


def prepare_backends(work_dir: Path) -> Path:
    """Copy Triton's python backend with the stub built for this Python; return backends dir."""
    dist = tritonserver_dist()
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonError(f"the Triton python backend has no stub for Python {version}")
    backends = work_dir / "backends"
    python_backend = backends / "python"
    if not (python_backend / "triton_python_backend_stub").is_file():
        shutil.copytree(dist / "backends" / "python", python_backend, dirs_exist_ok=True)
        shutil.copy2(stub, python_backend / "triton_python_backend_stub")
    return backends


def server_env() -> dict[str, str]:
    env = os.environ.copy()
    dist = tritonserver_dist()
    libs = [str(dist.parent.parent / "nvidia_pytriton.libs"), str(dist / "external_libs")]
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        libs.insert(0, str(libdir))
    env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    # The python backend stub runs models with the Python found first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


class TritonServer:
    """A tritonserver process on a model repository; a context manager that waits for ready."""

    def __init__(
        self,
        repository: Path,
        grpc_port: int | None = None,
        http_port: int | None = None,
        metrics_port: int | None = None,
        extra_args: list[str] | None = None,
        log_path: Path | None = None,
        work_dir: Path | None = None,
    ) -> None:
        self.repository = repository
        self.grpc_port = grpc_port or free_port()
        self.http_port = http_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.extra_args = extra_args or []
        self._work = work_dir or Path(tempfile.mkdtemp(prefix="voxfleet-triton-"))
        self.log_path = log_path or self._work / "tritonserver.log"
        self.process: subprocess.Popen[bytes] | None = None
        # The voice host its stream models run on (engines/pod/voice_host), started with it.
        from engines.pod.voice_host.process import VoiceHostProcess

        self.host = VoiceHostProcess(self._work, server_env(), log_path=self.log_path)

    @property
    def work_dir(self) -> Path:
        return self._work

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        backends = prepare_backends(self._work)
        command = [
            str(tritonserver_dist() / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--grpc-port={self.grpc_port}",
            f"--http-port={self.http_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=true",
            f"--exit-timeout-secs={EXIT_TIMEOUT_SECONDS}",
            *self.extra_args,
        ]
        return with_pod_flags(command)

    def start(self, timeout_s: float = 120.0, stdout_to_log: bool = True) -> TritonServer:
        from engines.pod.voice_host.process import VoiceHostError

        if not stdout_to_log:
            self.host.log_path = None
        try:
            self.host.start()
        except VoiceHostError as error:
            raise TritonError(f"{error}:\n{self.log_tail()}") from None
        log = open(self.log_path, "ab") if stdout_to_log else None
        try:
            self.process = subprocess.Popen(
                ended_with_this_process(self.command()),
                env=self.host.tritonserver_env(server_env()),
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            code = None if self.process is None else exit_status(self.process)
            if code is not None:
                self.stop()  # what it left in its process group goes with it
                raise TritonError(f"tritonserver exited with {code}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        self.stop()
        raise TritonError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = EXIT_TIMEOUT_SECONDS + 5) -> None:
        """SIGINT (Triton's graceful stop), up to `timeout_s` to exit, then SIGKILL to what is
        left of its process group: its backend stubs never outlive it."""
        try:
            if self.process is not None and self.process.returncode is None:
                end_process_group(self.process, signal.SIGINT, timeout_s)
        finally:
            self.host.stop()

    def run_foreground(self) -> int:
        """Wait for the server to exit; Ctrl-C or SIGTERM stop it cleanly. Returns the exit code."""

        def interrupt(*_: object) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            assert self.process is not None, "start() the server first"
            while (code := exit_status(self.process)) is None:
                time.sleep(0.2)
            self.stop()  # it exited by itself: what it left in its group goes too
            return code
        except KeyboardInterrupt:
            self.stop()
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)

    def __enter__(self) -> TritonServer:
        if self.process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
