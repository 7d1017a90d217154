"""Where a search's tasks run: this process, local worker processes, or a Ray cluster.

    with open_engine(workers=2) as engine:               # or open_engine(ray="auto")
        results = engine.map(task, problem, items, done)

`map` runs `task(problem, item)` for every item and returns the results in the items' order,
whatever order they finish in (`done(index, result)` is called as each one does, for the
progress bar). `start` sends them without waiting, and `wait` on what it returns is the rest
of `map`: tasks run in the order they are sent, so a batch can queue behind another one. A
task is a module-level function, so a worker imports it; the problem is a small picklable
value (`sim.search.problem.Problem`) each worker turns into its context once.

Local workers are `concurrent.futures.ProcessPoolExecutor` processes started by `forkserver`
(`spawn` where there is none): forks of a clean server that has imported the first task's
module (`_preload`), never of a process holding threads. Ray is optional (`pip install
'parasim[ray]'`) and imported only when asked for;
`--ray auto` joins the cluster `ray start` made on this machine, `--ray HOST:PORT` or
`ray://HOST:PORT` another one, and a Ray already initialized in this process (a test's
`ray.init(num_cpus=2)`) is used as it is.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from sim.search.orphans import end_forkserver_children, start_worker
from sim.search.problem import Problem
from sim.search.ray_address import check_reachable
from sim.search.stopped import first_completed
from traces.errors import ConfigError, Fault, show

T = TypeVar("T")
R = TypeVar("R")
Task = Callable[[Problem, T], R]
Done = Callable[[int, Any], None]
MAX_WORKERS = 1024


class Pending(Protocol[R]):
    """Tasks `Engine.start` sent."""

    def wait(self, done: Done | None = None) -> list[R]:
        """Their results in the items' order, once all are done (`done` as in `map`)."""


class Engine(Protocol):
    name: str
    workers: int

    def start(self, task: Task[T, R], problem: Problem, items: Sequence[T]) -> Pending[R]: ...

    def map(self, task: Task[T, R], problem: Problem, items: Sequence[T],
            done: Done | None = None) -> list[R]: ...

    def close(self) -> None: ...

    def abort(self) -> None:
        """Stop at once (Ctrl-C, an error): running tasks are not waited for."""


def default_workers() -> int:
    """Every core this process may run on, as many as the available memory holds."""
    memory = available_memory()
    return min(cores(), max(1, memory // WORKER_BYTES) if memory is not None else cores())


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


WORKER_BYTES = 64 * 2**20
"""What a local worker holds: 49 MiB resident once it has imported the simulator (measured,
Python 3.11, numpy + simpy + networkx), more while it simulates."""


def check_workers(workers: object) -> int:
    """`--workers`: from 1 to what this host holds, its cores and its available memory at
    `WORKER_BYTES` a worker (more would only thrash, or end in the OOM killer)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or \
            not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"--workers: {show(workers)} must be an integer from 1 to "
                          f"{MAX_WORKERS:,}")
    most = default_workers()
    if workers > most:
        memory = available_memory()
        room = "" if memory is None else f", {memory / 2**30:.1f} GiB available memory " \
            f"({WORKER_BYTES // 2**20} MiB a worker)"
        raise ConfigError(f"--workers: {workers} is more than this host holds: {cores()} "
                          f"cores{room}; give at most {most}")
    return workers


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class InProcess:
    """One worker: this process, no start-up cost."""

    name = "in-process"
    workers = 1

    def start(self, task: Task[T, R], problem: Problem, items: Sequence[T]) -> Pending[R]:
        """Nothing runs before `wait` (one process: the order is the waits')."""
        return _Deferred(task, problem, items)

    def map(self, task: Task[T, R], problem: Problem, items: Sequence[T],
            done: Done | None = None) -> list[R]:
        return self.start(task, problem, items).wait(done)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Processes:
    """`workers` local processes."""

    name = "processes"

    def __init__(self, workers: int) -> None:
        self.workers = workers
        methods = multiprocessing.get_all_start_methods()
        method = "forkserver" if "forkserver" in methods else "spawn"
        self.context = multiprocessing.get_context(method)
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=self.context,
                                        initializer=start_worker, initargs=(os.getpid(),))
        self.started = False

    def start(self, task: Task[T, R], problem: Problem, items: Sequence[T]) -> Pending[R]:
        with _ctrl_c_held():  # the pool forks its workers as the tasks are submitted
            if not self.started:  # the workers start with the first task
                self.started = True
                _preload(self.context, task.__module__)
            futures = [self.pool.submit(task, problem, item) for item in items]
        return _Futures(self.pool, futures)

    def map(self, task: Task[T, R], problem: Problem, items: Sequence[T],
            done: Done | None = None) -> list[R]:
        return self.start(task, problem, items).wait(done)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        """Terminate the workers: a queued simulation would otherwise run to its end (seconds)
        after Ctrl-C. The executor has no public way before Python 3.14
        (`terminate_workers`), hence its process table."""
        processes = list(getattr(self.pool, "_processes", {}).values())
        end_forkserver_children()  # those still starting too, which the pool may not know
        terminate = getattr(self.pool, "terminate_workers", None)
        if terminate is not None:
            terminate()
        else:
            for process in processes:
                process.terminate()
        # Joined here, each within seconds: a signal that interrupted the pool's own
        # bookkeeping may leave shutdown(wait=True) waiting forever.
        for process in processes:
            process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        manager = getattr(self.pool, "_executor_manager_thread", None)  # shutdown drops it
        self.pool.shutdown(wait=False, cancel_futures=True)
        # Let the pool's manager thread finish closing its wake-up pipe: at exit
        # concurrent.futures wakes every manager still registered, and one that closes the
        # pipe meanwhile makes that print "Exception ignored ... Bad file descriptor" after
        # the one line of Ctrl-C (1 run in 10 under load).
        if manager is not None:
            manager.join(5.0)


class _Deferred(Generic[T, R]):
    """`InProcess`'s tasks, run when waited for."""

    def __init__(self, task: Task[T, R], problem: Problem, items: Sequence[T]) -> None:
        self.task, self.problem, self.items = task, problem, items

    def wait(self, done: Done | None = None) -> list[R]:
        results = []
        for i, item in enumerate(self.items):
            results.append(self.task(self.problem, item))
            if done is not None:
                done(i, results[-1])
        return results


class _Futures(Generic[R]):
    """`Processes`' tasks in flight."""

    def __init__(self, pool: ProcessPoolExecutor, futures: list[Future[R]]) -> None:
        self.pool, self.futures = pool, futures

    def wait(self, done: Done | None = None) -> list[R]:
        return _gather(self.futures, partial(first_completed, self.pool), self._result, done)

    def _result(self, future: Future[R]) -> R:
        try:
            return future.result()
        except BrokenProcessPool:
            raise Fault(f"search: a worker process died ({_deaths(self.pool)}); "
                        "the search stopped") from None


Ready = Callable[[Sequence[Any]], tuple[Sequence[Any], Sequence[Any]]]
"""Of the handles pending: those finished (at least one, waiting for it) and those not."""


def _gather(handles: Sequence[Any], ready: Ready, fetch: Callable[[Any], Any],
            done: Done | None) -> list[Any]:
    """The results of `handles` (futures, Ray refs) in their order, each fetched as soon as
    `ready` (pending -> finished, still pending) says it is and given to `done` (its index,
    its result) right away, the finished of one wait in submission order."""
    index = {handle: i for i, handle in enumerate(handles)}
    results: list[Any] = [None] * len(handles)
    pending = handles
    while pending:
        finished, pending = ready(pending)
        for handle in sorted(finished, key=index.__getitem__):
            i = index[handle]
            results[i] = fetch(handle)
            if done is not None:
                done(i, results[i])
    return results


def _preload(context: Any, module: str) -> None:
    """Under forkserver, the server imports the first task's module (and `__main__`, as by
    default) before it forks the workers, so they start with the simulator imported rather
    than each importing it (0.6 CPU s a worker for the search's tasks). The server is started
    with one BLAS thread (`OPENBLAS_NUM_THREADS=1`; no task uses BLAS): numpy would otherwise
    start BLAS threads in it, and a worker would be the fork of a process holding threads.
    It is started ignoring SIGINT, as its workers do (`sim.search.orphans.start_worker`; an
    ignored signal stays ignored through exec): Ctrl-C reaches the whole process group, and
    the server ignores it itself only once it has imported. No effect where the server
    already runs (an earlier engine of this process)."""
    if context.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver  # noqa: PLC0415 (only where there is one)

    context.set_forkserver_preload(["__main__", module])
    saved = os.environ.get(BLAS_THREADS)
    os.environ[BLAS_THREADS] = "1"
    main = threading.current_thread() is threading.main_thread()  # signals: the main one's
    ctrl_c = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        forkserver.ensure_running()  # a fork and exec: it does not wait for the imports
    finally:
        if main:
            signal.signal(signal.SIGINT, ctrl_c)
        if saved is None:
            del os.environ[BLAS_THREADS]
        else:
            os.environ[BLAS_THREADS] = saved


BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def _deaths(pool: ProcessPoolExecutor) -> str:
    """How the pool's dead workers ended: 'killed by SIGKILL', 'exit code 1'."""
    how = []
    for process in list(getattr(pool, "_processes", {}).values()):
        code = process.exitcode
        if code is not None and code < 0:
            how.append(f"killed by {signal.Signals(-code).name}")
        elif code:
            how.append(f"exit code {code}")
    return ", ".join(sorted(set(how))) or "it was ended from outside"


@contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Ctrl-C held back until the block ends, then raised: while the pool forks a worker, an
    interrupt between the fork and the pool's record of it leaves a worker `abort` cannot
    see, which then unpickles its task after the parent is gone and prints a traceback after
    the one line (its queue's semaphores unlinked). Signals are the main thread's only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class RayCluster:
    """Tasks on a Ray cluster; `address` None uses the Ray this process has initialized."""

    name = "ray"

    def __init__(self, address: str | None) -> None:
        try:
            import ray  # noqa: PLC0415 (optional: imported only when asked for)
        except ImportError:
            raise ConfigError("--ray: Ray is not installed; pip install 'parasim[ray]'") \
                from None
        self.ray = ray
        self.owned = not ray.is_initialized()
        if self.owned:
            if not address:
                raise ConfigError("--ray: give the cluster's address (HOST:PORT, "
                                  "ray://HOST:PORT) or auto")
            check_reachable(address)  # before Ray, which retries for minutes
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise ConfigError(f"--ray: cannot join a Ray cluster at {address}: "
                                  f"{str(err).splitlines()[0] if str(err) else err!r}") \
                    from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote: dict[Any, Any] = {}

    def start(self, task: Task[T, R], problem: Problem, items: Sequence[T]) -> Pending[R]:
        remote = self._remote.get(task)
        if remote is None:
            remote = self._remote[task] = self.ray.remote(task)
        shared = self.ray.put(problem)
        return _Refs(self.ray, [remote.remote(shared, item) for item in items])

    def map(self, task: Task[T, R], problem: Problem, items: Sequence[T],
            done: Done | None = None) -> list[R]:
        return self.start(task, problem, items).wait(done)

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()

    def abort(self) -> None:
        self.close()


class _Refs:
    """`RayCluster`'s tasks in flight."""

    def __init__(self, ray: Any, refs: list[Any]) -> None:
        self.ray, self.refs = ray, refs

    def wait(self, done: Done | None = None) -> list[Any]:
        return _gather(list(self.refs), partial(self.ray.wait, num_returns=1), self.ray.get,
                       done)


@contextmanager
def open_engine(workers: int = 1, ray: str | None = None, *,
                use_ray: bool = False) -> Iterator[Engine]:
    """The engine for `workers` local workers (1: this process), or for the Ray cluster at
    `ray` (`use_ray` with no address: the Ray this process has initialized); closed after."""
    engine: Engine
    if ray is not None or use_ray:
        engine = RayCluster(ray)
    elif check_workers(workers) == 1:
        engine = InProcess()
    else:
        engine = Processes(workers)
    try:
        yield engine
    except BaseException:
        engine.abort()
        raise
    engine.close()
