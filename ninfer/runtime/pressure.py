"""Pause/resume policy: unit permits under pressure, pausing victims, resuming paused requests.

When a resident's next unit does not fit (KV pages or a StateImage slot), the ladder is:
1. reclaim optional cache (no context cache exists yet: the hook frees nothing);
2. revoke paused Snapshots that still hold device pages, youngest paused first;
3. pause the youngest resident younger than the one in need (never the protected resume),
   preferring a Snapshot while the host snapshot budget has room (the Program decides).
Requests are never paused for a younger one, and a paused request's trial resume never pauses a
resident while an older resident is still running.
"""
from __future__ import annotations

from ninfer.runtime.contract import Program, ResumeKind
from ninfer.runtime.metrics import EngineMetrics
from ninfer.runtime.record import RequestRecord, RequestState
from ninfer.runtime.scheduler import Scheduler


class PressurePolicy:
    def __init__(self, program: Program, scheduler: Scheduler, metrics: EngineMetrics):
        self._program = program
        self._sched = scheduler
        self._metrics = metrics
        self.actions = 0  # pauses, revocations and resumes so far (the worker's change detector)

    # --- relief actions ----------------------------------------------------------------------
    def reclaim_optional_cache(self) -> bool:
        """Free optional cached context (prefix cache, session checkpoints). None exists yet."""
        return False

    def revoke_device_snapshot(self, exclude: RequestRecord | None = None) -> bool:
        """Turn the youngest paused device-resident Snapshot into a Replay; True if one was."""
        for rec in reversed(self._sched.paused):
            state = rec.resume_state
            if rec is not exclude and state.kind is ResumeKind.SNAPSHOT and state.device_pages > 0:
                rec.resume_state = self._program.revoke_snapshot(state)
                self._metrics.inc("snapshot_revocations")
                self.actions += 1
                return True
        return False

    def pause(self, rec: RequestRecord) -> None:
        cap = self._program.capacity()
        prefer = ResumeKind.SNAPSHOT if cap.host_snapshot_bytes_free > 0 else ResumeKind.REPLAY
        state = self._program.pause(rec.seq, prefer)
        rec.seq, rec.resume_state = None, state
        self._sched.pause(rec)
        self._metrics.inc(f"pauses_{state.kind.value}")
        self.actions += 1

    def _relieve(self, rec: RequestRecord, victims_allowed: bool) -> bool:
        """Take one relief action for `rec`; False when nothing is left to try."""
        if self.reclaim_optional_cache() or self.revoke_device_snapshot(exclude=rec):
            return True
        if victims_allowed:
            victims = self._sched.victims(rec.ticket)
            if victims:
                self.pause(victims[0])
                return True
        return False

    # --- permits -----------------------------------------------------------------------------
    def reserve(self, rec: RequestRecord, n_tokens: int) -> bool:
        """Reserve `rec`'s next unit of `n_tokens`, relieving pressure as needed."""
        while not self._program.reserve_units(rec.seq, n_tokens):
            if not self._relieve(rec, victims_allowed=True):
                return False
        return True

    def try_resume(self) -> RequestRecord | None:
        """Fully resume the oldest paused request if it fits; it becomes the protected resume."""
        rec = self._sched.oldest_paused()
        if rec is None or self._sched.protected is not None:
            return None
        while True:
            seq = self._program.resume(rec.resume_state)
            if seq is not None:
                break
            # Younger borrowers are paused only when no older resident is still running.
            may_pause = not self._sched.has_older_resident(rec.ticket)
            if not self._relieve(rec, victims_allowed=may_pause):
                return None
        kind = rec.resume_state.kind
        rec.seq, rec.resume_state = seq, None
        self._sched.resume(rec)
        self._metrics.inc(f"resumes_{kind.value}")
        self.actions += 1
        return rec

    def stranded(self, rec: RequestRecord) -> bool:
        """True when `rec` cannot get its next unit and nothing will ever free room for it: it is
        the only resident and no paused state holds device pages."""
        alone = self._sched.residents == [rec]
        return alone and rec.state is RequestState.RESIDENT and not any(
            p.resume_state.device_pages for p in self._sched.paused)
