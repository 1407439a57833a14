"""`CudaGraph`: stream capture of CuPy work into a CUDA graph, replayed through cuda-python.

Usage::

    graph = CudaGraph("decode_b8")
    with ctx.activate(), graph.capture(ctx.stream):
        run_decode_step()          # our RawModule launches on preallocated buffers only
    graph.launch(ctx.stream)       # replay; inputs are the device buffers captured above
    graph.destroy()

What may run inside a capture (probed on the H200, CuPy 14.2): RawModule launches, CuPy
elementwise ops writing into a preallocated `out=`, device-to-device copies, and cuBLAS GEMMs
called through `kernels_cuda._cublas` (ctypes, handle bound to the capturing stream with a fixed
workspace). What breaks it: anything allocating from CuPy's pool, every cuBLAS call through
CuPy's own wrappers (they refuse while a stream captures), and the unload of a
garbage-collected CuPy module, so the garbage collector is disabled for the duration of the
capture (capture mode THREAD_LOCAL: other threads' CUDA calls are not affected).

Re-capturing into an existing graph first tries `cuGraphExecUpdate` (cheap, keeps the
executable), and re-instantiates when the topology changed.
"""
from __future__ import annotations

import contextlib
import gc

from ninfer.core.cuda._check import CudaError, check


def _driver():
    from cuda.bindings import driver

    return driver


def _stream_handle(stream):
    driver = _driver()
    return driver.CUstream(int(stream.ptr))


class CudaGraph:
    """One captured graph and its executable. Owns both; `destroy()` releases them."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self._graph = None
        self._exec = None
        self.num_captures = 0
        self.num_updates = 0
        self.num_launches = 0

    @property
    def ready(self) -> bool:
        return self._exec is not None

    @contextlib.contextmanager
    def capture(self, stream):
        """Capture the work queued on `stream` (a CuPy stream) inside the `with` block."""
        driver = _driver()
        handle = _stream_handle(stream)
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            check(driver.cuStreamBeginCapture(
                handle, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture")
            try:
                yield self
            except BaseException:
                # End the capture so the stream is usable again; drop the partial graph.
                err, partial = driver.cuStreamEndCapture(handle)
                if int(err) == 0 and partial is not None:
                    driver.cuGraphDestroy(partial)
                raise
            graph = check(driver.cuStreamEndCapture(handle), f"cuStreamEndCapture[{self.name}]")
        finally:
            if gc_was_enabled:
                gc.enable()
        self._install(graph)

    def _install(self, graph) -> None:
        driver = _driver()
        self.num_captures += 1
        if self._exec is not None:
            err, _info = driver.cuGraphExecUpdate(self._exec, graph)
            if int(err) == 0:
                check(driver.cuGraphDestroy(self._graph), "cuGraphDestroy")
                self._graph = graph
                self.num_updates += 1
                return
            self._destroy_exec()
        try:
            self._exec = check(driver.cuGraphInstantiate(graph, 0),
                               f"cuGraphInstantiate[{self.name}]")
        except CudaError:
            driver.cuGraphDestroy(graph)
            raise
        if self._graph is not None:
            check(driver.cuGraphDestroy(self._graph), "cuGraphDestroy")
        self._graph = graph

    def num_nodes(self) -> int:
        """Nodes in the captured graph (kernels, copies, ...)."""
        if self._graph is None:
            return 0
        _nodes, count = check(_driver().cuGraphGetNodes(self._graph), "cuGraphGetNodes")
        return int(count)

    def launch(self, stream) -> None:
        """Replay the graph on `stream` (asynchronous)."""
        if self._exec is None:
            raise RuntimeError(f"graph {self.name!r} was not captured")
        check(_driver().cuGraphLaunch(self._exec, _stream_handle(stream)),
              f"cuGraphLaunch[{self.name}]")
        self.num_launches += 1

    def _destroy_exec(self) -> None:
        if self._exec is not None:
            check(_driver().cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
            self._exec = None

    def destroy(self) -> None:
        """Release the executable and the graph. The caller synchronizes pending replays first."""
        self._destroy_exec()
        if self._graph is not None:
            check(_driver().cuGraphDestroy(self._graph), "cuGraphDestroy")
            self._graph = None

    def __del__(self):  # best effort; explicit destroy() is the contract
        try:
            self.destroy()
        except Exception:
            pass
