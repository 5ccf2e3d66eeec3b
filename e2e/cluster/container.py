"""One container of a local pod: its process, restarts, probes and termination.

Semantics follow the kubelet: a startup probe gates liveness and readiness; readiness needs
`successThreshold` successes in a row and is lost after `failureThreshold` failures; a
container that exits, or fails its liveness or startup probe `failureThreshold` times in a
row, is killed (preStop, SIGTERM, SIGKILL after the grace period) and restarted when the
pod's restartPolicy says so (Always; OnFailure on a non-zero exit), with restartCount
incremented and the previous run in `lastState`. Restart back-off: the first restart is
immediate, then 1 s doubling up to 10 s (the kubelet's is 10 s doubling up to 5 min), reset
after 60 s of running. Probe defaults are Kubernetes': periodSeconds 10, timeoutSeconds 1,
failureThreshold 3, successThreshold 1, initialDelaySeconds 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from .objects import now
from .probes import run_action

Obj = dict[str, Any]
LAUNCHER = Path(__file__).with_name("launcher.py")


def exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


class Container:
    def __init__(
        self,
        spec: Obj,
        restart_policy: str,
        netns: str,
        pod_ip: str,
        pod_name: str,
        pod_dir: Path,
        launch: Obj,
        changed: Callable[[], None],
        session: aiohttp.ClientSession,
        log_dir: Path,
    ) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.restart_policy = restart_policy
        self.netns = netns
        self.pod_ip = pod_ip
        self.pod_name = pod_name
        self.launch = launch  # argv, env, mounts, cpus, working_dir, created_file
        self.changed = changed
        self.session = session
        self.log_path = log_dir / f"{pod_name}_{self.name}.log"
        self.spec_path = pod_dir / f"{self.name}.launch.json"
        self.process: asyncio.subprocess.Process | None = None
        self.restart_count = 0
        self.started = False
        self.ready = False
        self.state: Obj = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: Obj = {}
        self.finished = False  # will not run again
        self.exit_code: int | None = None
        self.terminating = False
        self._kill = asyncio.Event()
        self._kill_reason = ""
        self._started_at = 0.0

    def status(self) -> Obj:
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }

    async def run(self) -> None:
        """Run until the container will not be restarted, or the pod terminates."""
        backoff = 0.0
        while not self.terminating:
            code = await self._run_once()
            if self.terminating:
                break
            again = self.restart_policy == "Always" or (
                self.restart_policy == "OnFailure" and code != 0
            )
            if not again:
                break
            if time.monotonic() - self._started_at > 60:
                backoff = 0.0
            self.restart_count += 1
            self.last_state = self.state
            if backoff > 0:
                self.state = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {backoff:g}s restarting failed container="
                        f"{self.name} pod={self.pod_name}",
                    }
                }
                self.changed()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wait_terminating(), backoff)
            backoff = min(10.0, max(1.0, backoff * 2))
        self.finished = True
        self.changed()

    async def _wait_terminating(self) -> None:
        while not self.terminating:
            await asyncio.sleep(0.1)

    async def _run_once(self) -> int:
        self.spec_path.write_text(json.dumps(self.launch))
        started_read, started_write = os.pipe()
        try:
            with open(self.log_path, "ab") as log:
                log.write(f"--- {now()} start {self.launch['argv']}\n".encode())
                log.flush()
                self.process = await asyncio.create_subprocess_exec(
                    "ip",
                    "netns",
                    "exec",
                    self.netns,
                    "unshare",
                    "--mount",
                    "--uts",
                    "--propagation",
                    "private",
                    "--",
                    sys.executable,
                    str(LAUNCHER),
                    str(self.spec_path),
                    str(started_write),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    pass_fds=(started_write,),
                )
        finally:
            os.close(started_write)
        try:
            # EOF once the launcher has exec'ed the command (or has failed).
            await asyncio.get_running_loop().run_in_executor(None, os.read, started_read, 1)
        finally:
            os.close(started_read)
        self._started_at = time.monotonic()
        self._kill.clear()
        self.started = "startupProbe" not in self.spec
        self.ready = False
        self.state = {"running": {"startedAt": now()}}
        self.changed()
        probes = asyncio.ensure_future(self._probe())
        exited = asyncio.ensure_future(self.process.wait())
        killed = asyncio.ensure_future(self._kill.wait())
        await asyncio.wait({exited, killed}, return_when=asyncio.FIRST_COMPLETED)
        probes.cancel()
        if not exited.done():
            await self.stop(self._grace())
        killed.cancel()
        code = await exited
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the rest of the container goes too
        with contextlib.suppress(asyncio.CancelledError):
            await probes
        code = 128 - code if code < 0 else code
        self.exit_code = code
        self.ready = False
        self.started = False
        terminated: Obj = {
            "exitCode": code,
            "reason": exit_reason(code),
            "startedAt": self.state.get("running", {}).get("startedAt", now()),
            "finishedAt": now(),
        }
        if self._kill_reason:
            terminated["message"] = self._kill_reason
        self.state = {"terminated": terminated}
        self._kill_reason = ""
        with open(self.log_path, "ab") as log:
            log.write(f"--- {now()} exited with {code}\n".encode())
        self.changed()
        return code

    def _grace(self) -> float:
        return float(self.launch.get("grace_s", 30))

    async def stop(self, grace_s: float, pre_stop: bool = True) -> None:
        """preStop within the grace period, SIGTERM, then SIGKILL when the period ends."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        deadline = time.monotonic() + grace_s
        hook = (self.spec.get("lifecycle") or {}).get("preStop")
        if hook and pre_stop:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    run_action(
                        hook,
                        self.spec,
                        self.pod_ip,
                        process.pid,
                        self.launch["env"],
                        max(0.1, grace_s),
                        self.session,
                    ),
                    max(0.1, grace_s),
                )
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), max(0.0, deadline - time.monotonic()) or 0.01)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def _probe(self) -> None:
        spec = self.spec
        if "startupProbe" in spec:
            if not await self._until(spec["startupProbe"]):
                return
            self.started = True
            self.changed()
        tasks = []
        if "livenessProbe" in spec:
            tasks.append(self._liveness(spec["livenessProbe"]))
        if "readinessProbe" in spec:
            tasks.append(self._readiness(spec["readinessProbe"]))
        else:
            self.ready = True
            self.changed()
        if tasks:
            await asyncio.gather(*tasks)

    async def _check(self, probe: Obj) -> tuple[bool, str]:
        process = self.process
        pid = process.pid if process else None
        timeout = float(probe.get("timeoutSeconds", 1))
        return await run_action(
            probe, self.spec, self.pod_ip, pid, self.launch["env"], timeout, self.session
        )

    async def _until(self, probe: Obj) -> bool:
        """Probe until `successThreshold` successes (True) or `failureThreshold` failures in a
        row, which kill the container (False)."""
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        failures = successes = 0
        while True:
            ok, why = await self._check(probe)
            if ok:
                successes, failures = successes + 1, 0
                if successes >= int(probe.get("successThreshold", 1)):
                    return True
            else:
                successes, failures = 0, failures + 1
                if failures >= int(probe.get("failureThreshold", 3)):
                    self._kill_reason = f"probe failed {failures} times: {why}"
                    self._kill.set()
                    return False
            await asyncio.sleep(period)

    async def _liveness(self, probe: Obj) -> None:
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        failures = 0
        while True:
            ok, why = await self._check(probe)
            failures = 0 if ok else failures + 1
            if failures >= int(probe.get("failureThreshold", 3)):
                self._kill_reason = f"Liveness probe failed: {why}"
                self._kill.set()
                return
            await asyncio.sleep(period)

    async def _readiness(self, probe: Obj) -> None:
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        failures = successes = 0
        while True:
            ok, _ = await self._check(probe)
            if ok:
                successes, failures = successes + 1, 0
                if not self.ready and successes >= int(probe.get("successThreshold", 1)):
                    self.ready = True
                    self.changed()
            else:
                successes, failures = 0, failures + 1
                if self.ready and failures >= int(probe.get("failureThreshold", 3)):
                    self.ready = False
                    self.changed()
            await asyncio.sleep(period)
