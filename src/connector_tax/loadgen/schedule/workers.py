"""The worker processes and the main process's side of the IPC.

One PUSH socket per worker (explicit round-robin, and control messages to each), one PULL
socket for every result, drained on an event-loop thread (uvloop) that hands each message to
the current cell's handler. Requests are sent from the session thread itself with a
non-blocking send, a little ahead of their time (the worker fires them on the dot), so no
thread hop through the loop adds to their latency; only the session thread ever touches the
PUSH sockets. Each worker serves one target (server URL); a duet's targets have workers of their
own, so one server's responses never share a worker's loop with the other's sends.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

import psutil
import uvloop
import zmq

from connector_tax.contract.summary import Priority
from connector_tax.loadgen import ipc
from connector_tax.loadgen.host.affinity import AffinityPlan, apply_affinity, plan_affinity, plan_paired
from connector_tax.loadgen.host.priority import raised
from connector_tax.loadgen.worker.process import WorkerConfig, worker_main
from connector_tax.loadgen.worker.prompts import BodySettings

Handler = Callable[[ipc.ToMain], None]


class WorkerStartError(RuntimeError):
    pass


IPC_PREFIX = "ctax-loadgen-"
STALE_AFTER_S = 3600.0


def ipc_dir() -> str:
    """A private (0700) directory for the pool's IPC sockets, named by this process's pid.

    A generator killed outright (SIGKILL, a cgroup's end) runs no exit path and leaves its
    directory behind: before making its own, a pool removes those whose pid is no longer alive
    and that are older than STALE_AFTER_S (a pid another PID namespace shares /tmp with can look
    dead; no pool takes an hour to start). Directories of other users are not ours to remove.
    A temporary folder too deep for a socket's path (107 bytes on Linux) gives way to /tmp."""
    base = tempfile.gettempdir()
    longest = f"{base}/{IPC_PREFIX}{os.getpid()}-xxxxxxxx/requests-999"  # mkdtemp adds 8 characters
    if len(os.fsencode(longest)) > zmq.IPC_PATH_MAX_LEN and os.path.isdir("/tmp"):
        base = "/tmp"
    now = time.time()
    try:
        names = os.listdir(base)
    except OSError:  # a temporary folder we may write to but not list: nothing to sweep
        names = []
    for name in names:
        pid, _, rest = name.removeprefix(IPC_PREFIX).partition("-")
        if not name.startswith(IPC_PREFIX) or not pid.isdigit() or not rest or psutil.pid_exists(int(pid)):
            continue
        path = os.path.join(base, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == os.getuid() and now - st.st_mtime > STALE_AFTER_S:
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-", dir=base)


class WorkerPool:
    def __init__(
        self,
        urls: Sequence[str],
        body: BodySettings,
        workers_per_target: int,
        seed: int,
        timeout_s: float,
        max_connections: int,
        prewarm_connections: int = 4,
        spin_ns: int = 1_000_000,
        spin_share: float = 0.1,
        affinity: bool = True,
        api_key_env: str | None = None,
        tls_verify: bool = True,
        tls_ca_file: str | None = None,
        rt_priority: int | None = None,
        target_cpus: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """`workers_per_target` workers for each URL (target t's are t * workers_per_target + j),
        each with `max_connections` // workers_per_target connections at most: a target's
        connections are its own. `target_cpus`: the paired plan (affinity.plan_paired)."""
        self.n_targets = len(urls)
        self.per_target = workers_per_target
        self.n_workers = n_workers = self.n_targets * workers_per_target
        self.plan: AffinityPlan | None = None
        if target_cpus is not None:
            self.plan = plan_paired(target_cpus, workers_per_target)
        elif affinity:
            self.plan = plan_affinity(n_workers)
        self._dir = ipc_dir()
        # ZMQ's I/O thread, started with the first socket, carries every hand-over to the workers:
        # it inherits the real-time class; the calling thread gets its own back.
        with raised(rt_priority, inherit=True):
            self._ctx = zmq.Context()
            self._results = self._ctx.socket(zmq.PULL)
        self._results.bind(f"ipc://{self._dir}/results")
        self.worker_priority: list[Priority | None] = [None] * n_workers
        self._pushes: list[zmq.Socket[bytes]] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._handler: Handler | None = None
        # Messages the receiver could not decode or handle: counted, the first few kept, never
        # fatal (the ZMQ fd is edge-triggered: a drain that stopped would leave the rest unread).
        self.receive_errors = 0
        self.first_receive_errors: list[str] = []
        self._lock = threading.Lock()
        self._cell_acks = 0
        spawn = multiprocessing.get_context("spawn")
        per_worker = max(1, max_connections // workers_per_target)
        for k in range(n_workers):
            push = self._ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.SNDHWM, 0)
            push.setsockopt(zmq.LINGER, 0)
            push.bind(f"ipc://{self._dir}/requests-{k}")
            self._pushes.append(push)
            cfg = WorkerConfig(
                worker_id=k,
                url=urls[self.target_of(k)],
                body=body,
                seed=seed,  # one seed for all: a trace's hash id must give the same tokens in every worker
                timeout_s=timeout_s,
                max_connections=per_worker,
                prewarm_connections=prewarm_connections,
                spin_ns=spin_ns,
                spin_share=spin_share,
                requests_addr=f"ipc://{self._dir}/requests-{k}",
                results_addr=f"ipc://{self._dir}/results",
                cpus=self.plan.worker_cpus[k] if self.plan else None,
                helper_cpus=self._helper_cpus(k),
                api_key_env=api_key_env,
                tls_verify=tls_verify,
                tls_ca_file=tls_ca_file,
                rt_priority=rt_priority,
                parent_pid=os.getpid(),
                target=self.target_of(k),
            )
            proc = spawn.Process(target=worker_main, args=(cfg,), name=f"ctax-loadgen-worker-{k}", daemon=True)
            self._procs.append(proc)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._unpinned: tuple[int, ...] = ()

    def target_of(self, worker: int) -> int:
        return worker // self.per_target

    def workers_of(self, target: int) -> range:
        return range(target * self.per_target, (target + 1) * self.per_target)

    def _helper_cpus(self, worker: int) -> tuple[int, ...] | None:
        if self.plan is None:
            return None
        return self.plan.helper_cpus[worker] if self.plan.helper_cpus else self.plan.loadgen_cpus

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        try:
            for proc in self._procs:
                proc.start()
            ready = 0
            deadline = time.monotonic() + timeout_s
            while ready < self.n_workers:
                remaining = deadline - time.monotonic()
                dead = [p.name for p in self._procs if p.exitcode is not None]
                if dead or remaining <= 0:
                    raise WorkerStartError(f"load generator workers did not start: {dead or 'timeout'}")
                if self._results.poll(int(min(remaining, 0.5) * 1000)):
                    message = ipc.to_main(self._results.recv())
                    if type(message) is ipc.Ready:
                        self.worker_priority[message.worker_id] = message.priority
                        ready += 1
            if self.plan:
                # Given back on close: a second pool in this process plans from what it may use.
                self._unpinned = tuple(sorted(os.sched_getaffinity(0)))
                apply_affinity(self.plan.loadgen_cpus)
            self._thread = threading.Thread(target=self._receive, name="ctax-loadgen-receiver", daemon=True)
            self._thread.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for push in self._pushes:
            try:
                push.send(ipc.pack(ipc.Stop()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            if proc.pid is None:
                continue
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(2.0)
        for push in self._pushes:
            push.close(linger=0)
        self._results.close(linger=0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._unpinned:
            apply_affinity(self._unpinned)
            self._unpinned = ()

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- traffic ----------------------------------------------------------------------
    def set_handler(self, handler: Handler | None) -> None:
        self._handler = handler

    def fire(self, worker: int, spec: ipc.RequestSpec, t_scheduled_ns: int) -> bool:
        """False when the worker is gone: with no high-water mark, a PUSH send only fails
        (EAGAIN) once its one peer has disconnected."""
        try:
            self._pushes[worker].send(ipc.pack(ipc.Fire(spec, t_scheduled_ns)), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def broadcast(self, message: ipc.CancelAll | ipc.Stop) -> None:
        data = ipc.pack(message)
        for push in self._pushes:
            try:
                push.send(data, zmq.NOBLOCK)
            except zmq.Again:
                pass  # a dead worker

    def set_cell(self, chunk_log_paths: list[str | None], timeout_s: float = 10.0) -> None:
        """Switch the workers' per-cell side files, and wait until every worker has."""
        with self._lock:
            self._cell_acks = 0
        sent = 0
        for push, path in zip(self._pushes, chunk_log_paths):
            try:
                push.send(ipc.pack(ipc.SetCell(path)), zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass  # a dead worker never acknowledges
        deadline = time.monotonic() + timeout_s
        while self._cell_acks < min(sent, len(self.live_workers())) and time.monotonic() < deadline:
            time.sleep(0.002)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    def live_workers(self) -> set[int]:
        return {k for k, p in enumerate(self._procs) if p.is_alive()}

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time used so far by the main process and by each worker."""
        times = {"main": sum(psutil.Process().cpu_times()[:2])}
        for k, pid in enumerate(self.pids()):
            try:
                times[f"worker{k}"] = sum(psutil.Process(pid).cpu_times()[:2])
            except psutil.Error:
                times[f"worker{k}"] = 0.0
        return times

    # -- receiver thread --------------------------------------------------------------
    def _receive(self) -> None:
        loop = uvloop.new_event_loop()
        self._loop = loop
        fd = self._results.getsockopt(zmq.FD)
        loop.add_reader(fd, self._drain)
        loop.call_soon(self._drain)
        try:
            loop.run_forever()
        finally:
            loop.remove_reader(fd)
            loop.close()

    def _drain(self) -> None:
        results = self._results
        # Edge-triggered: everything now. EVENTS says when nothing is left (an exception per
        # drain, zmq.Again, was ~4 % of the main process's CPU under py-spy).
        while int(results.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                data = results.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = ipc.to_main(data)
                if type(message) is ipc.CellSet:
                    with self._lock:
                        self._cell_acks += 1
                    continue
                handler = self._handler
                if handler is not None:
                    handler(message)
            except Exception as exc:  # noqa: BLE001 - one bad message must not stop the drain
                self.receive_errors += 1
                if len(self.first_receive_errors) < 3:
                    self.first_receive_errors.append(f"{type(exc).__name__}: {exc}")
