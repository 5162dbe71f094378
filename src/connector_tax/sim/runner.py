"""Runs the engine core in real time on its own thread.

A step is scheduled (under the lock that also guards submissions), logged, and then the
thread sleeps until the step's modelled end before it publishes the step's tokens. The
deadline counts from the step's start, so the Python work of scheduling is inside the modelled
duration rather than added to it. `time.sleep` on Linux wakes within ~0.1 ms; the
event-loop timers the HTTP side could offer are 1 ms coarse, which is why this is a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from connector_tax.sim.engine import EngineCore, SimRequest, StepResult
from connector_tax.sim.steplog import StepLog

Publish = Callable[[StepResult, int], None]


class EngineRunner:
    def __init__(
        self,
        core: EngineCore,
        publish: Publish,
        on_step: Callable[[StepResult], None],
        step_log: StepLog | None,
        on_death: Callable[[BaseException], None],
    ) -> None:
        self.core = core
        self._publish = publish
        self._on_step = on_step
        self._step_log = step_log
        self._on_death = on_death
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sim-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=2.0)
        if self._step_log is not None:
            self._step_log.close()

    def submit(self, request: SimRequest) -> None:
        with self._cond:
            self.core.add_request(request)
            self._cond.notify()

    def abort(self, request: SimRequest) -> None:
        with self._cond:
            self.core.abort_request(request)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the engine died: the server must say so, not hang
            self._on_death(exc)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self.core.has_work():
                    self._cond.wait()
                if self._stopped:
                    return
                t_start = time.monotonic_ns()
                result = self.core.step()
                if result is None:
                    # Work exists but none fits (KV cache full): wait for a change.
                    self._cond.wait(timeout=0.005)
                    continue
            if self._step_log is not None:
                self._step_log.write(result, t_start)
            t_end = t_start + int(result.cost.duration_us * 1000)
            remaining = t_end - time.monotonic_ns()
            if remaining > 0:
                time.sleep(remaining / 1e9)
            self._publish(result, time.monotonic_ns())
            self._on_step(result)
