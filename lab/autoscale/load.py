"""A load step: `voxfleet bench`'s closed-loop streams, with a concurrency that changes in phases.

Each worker is a listener: it holds one stream at a time and asks for its next sentence when
the previous stream ends, as `voxfleet bench` does; worker `i` is active while the current
phase's concurrency is above `i`. Listeners reach the voice's pods through the bench's
balanced system (`engines.bench.systems.BalancedTritonSystem`): long-lived connections, one
per pod, a pod picked per stream by the fewest streams in flight, the pods listed by the
voice's headless Service (looked up again every 2 s, as DNS would be), and a stream a full pod
refuses sent to another pod. Two client layouts (`LAYOUTS`):

- `per-listener`: every listener holds its own client and connections, as the benchmark's
  client processes and voice-agent workers each do (`voxfleet bench --client-processes N`);
- `shared`: one client and one connection per pod for every listener, as one process serving
  many listeners does.

A stream every pod refused (RESOURCE_EXHAUSTED) is a refusal, not a failure: the listener waits
`RETRY_AFTER_S` and asks again for the same sentence, and the record of its admitted stream
keeps when it first asked (`asked_s`), so that its wait counts the refusals. Other failures end
the stream when the error arrives; the worker backs off and moves on. Timelines are the
benchmark's `StreamRecord`s, so first audio and underruns are counted as in the benchmark.

The listeners run in a process of their own (`ListenerProcess`), as they would on machines of
their own: a listener stamps each chunk when its event loop gets to it, so a loop kept waiting
stamps chunks late that the pod sent on time. In the harness's process the loop waited for the
threads beside it (the sampler, each client's endpoint lookups with two `kubectl` runs), up to
865 ms, and every late chunk of a run on the real node was stamped as such a wait ended
(docs/autoscaling.md, "Where the underruns were"). The harness drives the phases and looks the
voice's Service up once every `ttl_s`; the listeners' lookups read its last answer, as a
client's lookups read a node's DNS cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from cluster.processes import die_with_parent

from engines.bench.stats import is_refusal
from engines.bench.systems import BalancedTritonSystem
from engines.bench.timeline import Chunk, StreamRecord
from engines.text.corpus import cycle_sentences, load_corpus, sentence_order

Clock = Callable[[], float]
Pods = Callable[[], Sequence[str]]
# How long a listener waits after a refused or failed stream before it asks again.
RETRY_AFTER_S = 0.2
# The listeners' event loop is watched every STALL_TICK_S; a wake-up more than STALL_S late is
# a stall (`Listeners`): a listener's second chunk is due 186 ms after its first.
STALL_TICK_S = 0.01
STALL_S = 0.03
LAYOUTS = ("per-listener", "shared")
# The listeners' process runs real-time, round robin at the lowest real-time priority
# (`listener_priority`): listeners run on other machines than the pods they hear, and here they
# share the pods' 2 cores. At nice -10 (a weight of 9,548 against the node's 8,192) a thread
# of theirs still waited up to 372 ms for a CPU while two pods kept both busy, and every late
# chunk of such a run was stamped as the wait ended. They use a few hundredths of a core
# (`cpu_cores.listeners`), so their priority costs the pods little; the kernel keeps 5 % of
# every second from real-time threads whatever they do (sched_rt_runtime_us).
LISTENER_RT_PRIORITY = 1
# Where real-time priority is refused (no CAP_SYS_NICE), the listeners' nice value instead.
LISTENER_NICE = -10
# While the listeners' loop is this far behind its tick, `LoopWitness` notes where its thread is.
WITNESS_S = 0.08
WITNESS_TICK_S = 0.02
# How often the listeners' process reports each client's counts to the harness.
COUNTS_EVERY_S = 1.0
# How long the harness waits for the listeners' process to start and reach the voice.
READY_TIMEOUT_S = 120.0


class System(Protocol):
    def open_stream(self, text: str) -> Any: ...

    async def close(self) -> None: ...


# (voice, pods) -> a client of the voice over those pods: `balanced_system` unless a test
# gives another (it must be importable by name: the listeners' process is started afresh).
SystemFactory = Callable[[str, Pods], Any]


def balanced_system(voice: str, pods: Pods) -> BalancedTritonSystem:
    return BalancedTritonSystem("voxfleet-pods", "", voice, pods=pods)


@dataclass(frozen=True)
class Phase:
    """`concurrency` listeners for `seconds`; a callable concurrency is read when the phase
    starts (after `before`, which may change the world first, e.g. apply a manifest)."""

    name: str
    concurrency: int | Callable[[], int]
    seconds: float
    before: Callable[[], None] | None = None


@dataclass
class TimedRecord:
    """A benchmark stream record, the phase it was sent in, and when its listener first asked
    for that sentence (before any refusal)."""

    phase: str
    record: StreamRecord
    asked_s: float = 0.0

    @property
    def refused(self) -> bool:
        return is_refusal(self.record.error)


@dataclass
class Clients:
    """The listeners' clients: one for all (`shared`) or one per listener."""

    layout: str
    pods: Callable[[], Pods]  # a fresh endpoint source (its own lookups) per client
    voice: str
    make: SystemFactory = balanced_system
    made: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout is one of {', '.join(LAYOUTS)}, not {self.layout!r}")

    def _make(self) -> Any:
        system = self.make(self.voice, self.pods())
        self.made.append(system)
        return system

    def for_listener(self, index: int) -> Any:
        if self.layout == "shared":
            return self.made[0] if self.made else self._make()
        while len(self.made) <= index:
            self._make()
        return self.made[index]

    def counts(self) -> dict[str, dict[str, int]]:
        """Streams started, refusals and failures per pod, over every client so far."""
        out: dict[str, dict[str, int]] = {}
        for system in list(self.made):
            balancer = getattr(system, "balancer", None)
            for endpoint, counts in (balancer.counts() if balancer else {}).items():
                entry = out.setdefault(endpoint, {"streams": 0, "refusals": 0, "failures": 0})
                entry["streams"] += counts.streams
                entry["refusals"] += counts.refusals
                entry["failures"] += counts.failures
        return out

    @property
    def refused_streams(self) -> int:
        return sum(
            system.balancer.refused_streams
            for system in list(self.made)
            if getattr(system, "balancer", None) is not None
        )

    async def close(self) -> None:
        for system in self.made:
            await system.close()


def corpus_sentences() -> Iterator[str]:
    """The benchmark's sentences, in its order, round and round."""
    return cycle_sentences(sentence_order(load_corpus()))


async def reachable(
    pods: Pods, voice: str, make: SystemFactory = balanced_system, timeout_s: float = 60.0
) -> None:
    """Wait until one stream reaches the voice through its pods' Service.

    A voice is Ready once its model is loaded and its pod labelled; the Service lists the pod
    a moment later (the endpoints follow the label). The load starts after that moment, so its
    first streams measure the voice, not the Service's catching up."""
    deadline = time.monotonic() + timeout_s
    while True:
        system = make(voice, pods)
        try:
            async for _ in system.open_stream("Ready."):
                pass
            return
        except Exception as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"no stream reached {voice}: {error}") from error
            await asyncio.sleep(0.5)
        finally:
            await system.close()


class Listeners:
    """The listeners of one event loop: `set` how many listen and in which phase, `finish` to
    let them end their streams and stop.

    `ended` gets each stream's record once it is final: ended, failed, refused, or cut off by
    `finish`. `stalls`, where given, gets (when it ended, seconds) for every time the loop woke
    more than STALL_S late: a chunk that arrives meanwhile is stamped late, by the listener,
    not the pod."""

    def __init__(
        self,
        clients: Clients,
        sentences: Iterator[str],
        ended: Callable[[TimedRecord], None],
        clock: Clock = time.monotonic,
        stalls: list[tuple[float, float]] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.clients = clients
        self.sentences = sentences
        self.ended = ended
        self.clock = clock
        self.stalls = stalls
        self.on_tick = on_tick  # called at each of the stall watch's ticks
        self.phase, self.concurrency = "", 0
        self._stop = asyncio.Event()
        self._workers: list[asyncio.Future[None]] = []
        self._watcher = asyncio.ensure_future(self._watch()) if stalls is not None else None

    def set(self, phase: str, concurrency: int) -> None:
        self.phase, self.concurrency = phase, concurrency
        while len(self._workers) < concurrency:
            self._workers.append(asyncio.ensure_future(self._worker(len(self._workers))))

    async def finish(self, drain_s: float) -> None:
        """Start no stream more; wait up to `drain_s` for those in flight, then cut them."""
        self._stop.set()
        self.concurrency = 0
        try:
            if self._workers:
                await asyncio.wait(self._workers, timeout=drain_s)
        finally:
            for task in self._workers:
                task.cancel()
            await asyncio.gather(*self._workers, return_exceptions=True)
            if self._watcher is not None:
                await asyncio.gather(self._watcher, return_exceptions=True)

    async def _watch(self) -> None:
        assert self.stalls is not None
        while not self._stop.is_set():
            if self.on_tick is not None:
                self.on_tick()
            before = self.clock()
            await asyncio.sleep(STALL_TICK_S)
            late = self.clock() - before - STALL_TICK_S
            if late > STALL_S:
                self.stalls.append((self.clock(), late))

    async def _worker(self, index: int) -> None:
        await asyncio.sleep(0.2 * index)
        system = self.clients.for_listener(index)
        text, asked = next(self.sentences), None
        while not self._stop.is_set():
            if index >= self.concurrency:
                await asyncio.sleep(0.2)
                continue
            now = self.clock()
            record = StreamRecord(text=text, sent_s=now)
            item = TimedRecord(self.phase, record, asked if asked is not None else now)
            try:
                async for samples, rate in system.open_stream(record.text):
                    record.chunks.append(Chunk(self.clock(), samples))
                    if rate:
                        record.sample_rate = rate
                record.ended_s = self.clock()
            except asyncio.CancelledError:
                record.error = "cut off: still streaming when the run ended"
                raise
            except Exception as error:  # a failed stream is a result, ended when it failed
                record.error = f"{type(error).__name__}: {error}"
                record.ended_s = self.clock()
            finally:
                self.ended(item)
            if item.refused:
                asked = item.asked_s  # the same listener asks again for the same sentence
            else:
                text, asked = next(self.sentences), None
            if record.error is not None:
                await asyncio.sleep(RETRY_AFTER_S)


class LoopWitness:
    """A thread beside an event loop that notes where the loop's thread is while the loop is
    more than WITNESS_S behind its own tick (`beat`): its innermost frames, which say "waiting
    for events" where it sat in the selector (then no code of the loop's held it: the thread
    waited for a CPU or for the interpreter lock). Where the witness itself wakes WITNESS_S
    late, it notes that instead."""

    WAITING = "waiting for events (selector)"
    STARVED = "the witness itself woke late: waited for a CPU or the interpreter lock"

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.last_beat = time.monotonic()
        self.seen: dict[str, list[float]] = {}  # where -> [samples, the longest behind (s)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loop-witness", daemon=True)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def start(self) -> LoopWitness:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def report(self, top: int = 20) -> list[dict[str, Any]]:
        ranked = sorted(self.seen.items(), key=lambda item: -item[1][0])[:top]
        return [
            {"where": where, "samples": int(n), "longest_behind_ms": round(behind * 1000, 1)}
            for where, (n, behind) in ranked
        ]

    def _note(self, where: str, behind: float) -> None:
        entry = self.seen.setdefault(where, [0, 0.0])
        entry[0] += 1
        entry[1] = max(entry[1], behind)

    def _run(self) -> None:
        while True:
            before = time.monotonic()
            if self._stop.wait(WITNESS_TICK_S):
                return
            now = time.monotonic()
            if now - before - WITNESS_TICK_S > WITNESS_S:
                self._note(self.STARVED, now - before - WITNESS_TICK_S)
            elif now - self.last_beat > WITNESS_S:
                self._note(
                    self.where(sys._current_frames().get(self.thread_id)), now - self.last_beat
                )

    @classmethod
    def where(cls, frame: Any, depth: int = 5) -> str:
        if frame is None:
            return "gone"
        if frame.f_code.co_name == "select" and frame.f_code.co_filename.endswith("selectors.py"):
            return cls.WAITING
        places: list[str] = []
        while frame is not None and len(places) < depth:
            places.append(
                f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
            )
            frame = frame.f_back
        return " < ".join(places)


@dataclass(frozen=True)
class ListenerSpec:
    """What the listeners' process needs: the client layout, the voice, how often the harness
    looks its Service up again, and (importable by name) how to make a client and where the
    sentences come from."""

    layout: str
    voice: str
    ttl_s: float = 2.0
    make: SystemFactory = balanced_system
    sentences: Callable[[], Iterator[str]] = corpus_sentences


def listener_priority() -> str:
    """Every thread of this process, and those it starts from now on (they inherit it),
    real-time round robin at LISTENER_RT_PRIORITY, else at nice LISTENER_NICE; returns which."""
    tasks = [int(task.name) for task in Path("/proc/self/task").iterdir()]
    try:
        for task in tasks:
            os.sched_setscheduler(task, os.SCHED_RR, os.sched_param(LISTENER_RT_PRIORITY))
        return f"SCHED_RR {LISTENER_RT_PRIORITY}"
    except (PermissionError, OSError):
        for task in tasks:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, task, LISTENER_NICE)
        return f"nice {LISTENER_NICE}"


def listen(conn: Connection, spec: ListenerSpec) -> None:
    """The listeners' process (`ListenerProcess`): killed when the harness dies, deaf to the
    terminal's Ctrl-C (the harness stops it), at `listener_priority`."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    priority = listener_priority()
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def send() -> None:  # off the loop: a full pipe must not stall it
        while (message := outbox.get()) is not None:
            conn.send(message)

    sender = threading.Thread(target=send, name="listeners-send", daemon=True)
    sender.start()
    try:
        asyncio.run(_listen(conn, spec, outbox.put, priority))
    except BaseException as error:
        outbox.put(("error", f"{type(error).__name__}: {error}"))
        raise
    finally:
        outbox.put(None)
        sender.join(timeout=30)


async def _listen(
    conn: Connection, spec: ListenerSpec, send: Callable[[Any], None], priority: str
) -> None:
    loop = asyncio.get_running_loop()
    known: list[str] = []
    have_endpoints = asyncio.Event()
    commands: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def readable() -> None:
        while conn.poll():
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the harness is gone: stop at once
                loop.remove_reader(conn.fileno())
                commands.put_nowait(("stop", 0.0))
                return
            if message[0] == "endpoints":
                known[:] = message[1]
                have_endpoints.set()
            else:
                commands.put_nowait(message)

    loop.add_reader(conn.fileno(), readable)

    def source() -> Pods:
        # The harness's answer is already looked up again every ttl_s: a client reads it as
        # it stands, with no lookup thread of its own.
        return lambda: list(known)

    await asyncio.wait_for(have_endpoints.wait(), READY_TIMEOUT_S)
    await reachable(source(), spec.voice, spec.make)
    clients = Clients(spec.layout, source, spec.voice, spec.make)
    stalls: list[tuple[float, float]] = []
    witness = LoopWitness(threading.get_ident()).start()
    listeners = Listeners(
        clients,
        spec.sentences(),
        lambda item: send(("record", item)),
        stalls=stalls,
        on_tick=witness.beat,
    )

    async def report_counts() -> None:
        while True:
            await asyncio.sleep(COUNTS_EVERY_S)
            send(("counts", clients.counts(), clients.refused_streams))

    counting = asyncio.ensure_future(report_counts())
    send(("ready", priority))
    try:
        while True:
            message = await commands.get()
            if message[0] == "phase":
                listeners.set(message[1], message[2])
            elif message[0] == "stop":
                witness.stop()  # the stall watch ends with the listeners
                await listeners.finish(message[1])
                break
    finally:
        counting.cancel()
        witness.stop()
        await clients.close()
        send(("counts", clients.counts(), clients.refused_streams))
        send(("done", stalls, witness.report()))


class ListenerProcess:
    """The listeners in a process of their own (see the module docstring), driven from here.

    A context manager: entering starts the process, gives it the voice's endpoints (`lookup`,
    called here every `ttl_s`) and returns once a stream has reached the voice; `phase` sets
    how many listen; `finish` lets their streams end and collects the last records. Each
    final record is appended to `records` as it comes; `counts()`, `refused_streams`, `stalls`
    and `stall_places` (`LoopWitness.report`) are the listeners' own, as last reported.
    Leaving stops the process whatever happened."""

    def __init__(
        self,
        spec: ListenerSpec,
        lookup: Callable[[], list[str]],
        records: list[TimedRecord],
    ) -> None:
        if spec.layout not in LAYOUTS:
            raise ValueError(f"layout is one of {', '.join(LAYOUTS)}, not {spec.layout!r}")
        self.spec = spec
        self.lookup = lookup
        self.records = records
        self.stalls: list[tuple[float, float]] = []
        # Where the listeners' loop was while it stalled (`LoopWitness.report`).
        self.stall_places: list[dict[str, Any]] = []
        self.priority = ""  # the listeners' scheduling (`listener_priority`), once they run
        self._counts: dict[str, dict[str, int]] = {}
        self._refused = 0
        self._error: str | None = None
        self._ready, self._done, self._closing = (threading.Event() for _ in range(3))
        self._send_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._process: Any = None
        self._conn: Connection | None = None

    def __enter__(self) -> ListenerProcess:
        context = multiprocessing.get_context("spawn")
        self._conn, theirs = context.Pipe()
        self._process = context.Process(
            target=listen, args=(theirs, self.spec), name="listeners", daemon=True
        )
        self._process.start()
        theirs.close()
        try:
            self._push_endpoints()
            for target, name in ((self._read, "listeners-read"), (self._push, "endpoints")):
                thread = threading.Thread(target=target, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not self._ready.wait(0.2):
                if self._error is not None or not self._process.is_alive():
                    raise RuntimeError(f"the listeners' process failed: {self._why()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the listeners reached no pod of {self.spec.voice} in "
                        f"{READY_TIMEOUT_S:.0f} s"
                    )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        if self._process is not None:
            self._process.join(timeout=10 if self._done.is_set() else 0)
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        for thread in self._threads:
            thread.join(timeout=10)

    @property
    def pid(self) -> int | None:
        """The listeners' process's, while it runs."""
        return self._process.pid if self._process is not None else None

    def phase(self, name: str, concurrency: int) -> None:
        self._send(("phase", name, concurrency))

    def check(self) -> None:
        """RuntimeError if the listeners' process is gone or failed."""
        if self._error is not None or not self._process.is_alive():
            raise RuntimeError(f"the listeners' process failed: {self._why()}")

    def finish(self, drain_s: float) -> None:
        """Let the streams in flight end (at most `drain_s`), then collect the last records."""
        self._send(("stop", drain_s))
        deadline = time.monotonic() + drain_s + 30
        while not self._done.wait(0.2):
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the listeners did not stop within {drain_s + 30:.0f} s")

    def counts(self) -> dict[str, dict[str, int]]:
        return self._counts

    @property
    def refused_streams(self) -> int:
        return self._refused

    def _why(self) -> str:
        if self._error is not None:
            return self._error
        return f"it exited with {self._process.exitcode}"

    def _send(self, message: tuple[Any, ...]) -> None:
        assert self._conn is not None
        with self._send_lock:
            self._conn.send(message)

    def _push_endpoints(self) -> None:
        try:
            found = self.lookup()
        except Exception:  # a failed lookup keeps the last answer, as a client's does
            return
        with contextlib.suppress(OSError, ValueError):
            self._send(("endpoints", list(found)))

    def _push(self) -> None:
        while not self._closing.wait(self.spec.ttl_s):
            self._push_endpoints()

    def _read(self) -> None:
        assert self._conn is not None
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "record":
                self.records.append(message[1])
            elif kind == "counts":
                self._counts, self._refused = message[1], message[2]
            elif kind == "ready":
                self.priority = message[1]
                self._ready.set()
            elif kind == "error":
                self._error = message[1]
            elif kind == "done":
                self.stalls, self.stall_places = message[1], message[2]
                self._done.set()


class PhaseTarget(Protocol):
    def phase(self, name: str, concurrency: int) -> None: ...

    def check(self) -> None: ...

    def finish(self, drain_s: float) -> None: ...


def drive_phases(
    listeners: PhaseTarget,
    phases: Sequence[Phase],
    until: Callable[[], bool] | None = None,
    started: Callable[[str, float, int], None] | None = None,
    drain_s: float = 60.0,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Run the phases in order; the last one also ends early once `until()` is true.
    `started(name, time, concurrency)` is called as each phase begins."""
    for index, phase in enumerate(phases):
        if phase.before is not None:
            phase.before()
        concurrency = phase.concurrency() if callable(phase.concurrency) else phase.concurrency
        listeners.phase(phase.name, concurrency)
        begun = clock()
        if started is not None:
            started(phase.name, begun, concurrency)
        last = index == len(phases) - 1
        while clock() < begun + phase.seconds:
            if last and until is not None and until():
                break
            listeners.check()
            sleep(0.5)
    listeners.finish(drain_s)
