"""The supervisor: a run kept alive from outside its training cluster.

It provisions a cluster for the best offer (failing over to the next-best one when provisioning
fails, and remembering failed offers for ``block_s``, as SkyPilot's blocked resources), submits the
user's unmodified driver there through Ray's Job API with the run's environment variables, streams
its output, follows the run record and events the job writes into the run's storage, and:

- **migrates** when the job asks (record status ``migrating``, driver exit 75): provision the target,
  submit the driver there with ``RAYPIPE_RESUME=require``, wait for its ``job_started`` with
  ``resumed_from`` equal to the step, and only then tear the old cluster down;
- **relaunches** when the cluster or the driver dies without asking (any other failure while the
  record says ``running``, or a head unreachable for ``unreachable_s``), from the newest committed
  checkpoint, on the best offer not blocked, within ``max_recoveries``;
- reports a user error (exit 1 or 2 with record status ``failed``) once, with the driver's last lines;
- **survives its own restart**: :class:`~orchestrator.supervise.state.SupervisorState` in the run's
  storage names the cluster and the job, and every cluster it owns (source and target during a migration);
  a restarted supervisor tears down the owned clusters it no longer needs, adopts the job's (or relaunches),
  and a second supervisor on a run that has a live owner refuses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cloud.records import Offer
from actors.storage import StorageError, StorageFailed
from actors.storage_env import EXIT_STORAGE
from orchestrator.core.errors import UserError
from orchestrator.elastic.observability import redact_text
from orchestrator.elastic.run_record import RunRecord, request_stop
from orchestrator.elastic.signals import EXIT_MIGRATE
from orchestrator.supervise.offers import PRICE_FACTOR, ranked, write_price_file
from orchestrator.supervise.provision import ClusterHandle, ProvisionError, Provisioner
from orchestrator.supervise.state import RETRY_S, EventSegment, StateStore, SupervisorState, merged_events, newest_committed, read_record
from orchestrator.supervise.submit import TERMINAL, DriverJob, TextSink

USER_ERROR_EXITS = (1, 2)


@dataclass(frozen=True, kw_only=True)
class SupervisorConfig:
    """What to run, where its state lives, and the rehearsals."""

    driver: tuple[str, ...]
    """The driver script and its arguments (run as ``python DRIVER ARGS`` on the cluster)."""
    storage: str
    offers: tuple[Offer, ...]
    working_dir: str = "."
    python: str = sys.executable
    run_id: str | None = None
    resume: str = "auto"
    out: Path | None = None
    """Folder for the price file and, at the end, the merged ``events.jsonl``."""
    price_change_at: int | None = None
    kill_cluster_at: int | None = None
    max_recoveries: int = 3
    block_s: float = 600.0
    unreachable_s: float = 15.0
    resume_timeout_s: float = 600.0
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.driver:
            raise UserError("orchestrator run: give the driver after --, e.g. -- examples/elastic_gpt.py --steps 24")
        if not self.offers:
            raise UserError("orchestrator run: no offers to run on")
        if self.resume not in ("auto", "never", "require"):
            raise UserError(f"--resume must be auto, never or require, not {self.resume!r}")
        for flag, value in (("--price-change-at", self.price_change_at), ("--kill-cluster-at", self.kill_cluster_at)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be >= 1, got {value}")
        if self.max_recoveries < 0:
            raise UserError("--max-recoveries must be >= 0")


class RunFailed(Exception):
    """The run ended without finishing: ``code`` is the supervisor's exit status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class _Current:
    """The cluster the job runs on now and its submission (owned by the supervisor's loop)."""

    handle: ClusterHandle
    job: DriverJob
    offer: Offer
    unreachable_since: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Supervisor:
    """See the module docstring. ``run()`` returns 0 when the driver finished."""

    def __init__(self, config: SupervisorConfig, provisioner: Provisioner, out: TextSink | None = None) -> None:
        self.config = config
        self.provisioner = provisioner
        self.out = out or sys.stdout
        self.store = StateStore(config.storage)
        self.events = EventSegment(config.storage)
        self.by_label = {o.label(): o for o in config.offers}
        self.interrupted = False  # a first Ctrl-C: the run is being stopped
        self.billed: dict[str, tuple[float, float]] = {}  # cluster id -> (up since, $/h) of the clusters up now
        self.usd_clusters = 0.0  # the clusters torn down so far
        self.prices = Path()
        self.state = SupervisorState(run_id=config.run_id or uuid.uuid4().hex[:12])

    # ----- state -----
    def _save(self, retry_s: float = RETRY_S, **changes: Any) -> None:
        self.state = self.store.save(replace(self.state, **changes), retry_s)

    def _take_ownership(self) -> SupervisorState | None:
        previous = self.store.load()
        now = time.time()
        if previous is not None and previous.owned_by_other(now):
            raise UserError(f"{self.config.storage} is already supervised by pid {previous.pid} on {previous.host} "
                            f"(heartbeat {now - previous.heartbeat:.0f} s ago); not starting a second copy")
        record = read_record(self.config.storage)
        run_id = (previous.run_id if previous else None) or (record.run_id if record else None) or self.state.run_id
        if self.config.run_id and run_id != self.config.run_id and (previous or record):
            raise UserError(f"{self.config.storage} holds run {run_id}, not --run-id {self.config.run_id}")
        # a finished supervisor's cluster is gone, but the offers that failed stay blocked for a while
        base = previous if previous is not None and not previous.finished else \
            SupervisorState(run_id=run_id, failed_offers=previous.failed_offers if previous else {},
                            clusters_made=previous.clusters_made if previous else 0, owned=previous.owned if previous else ())
        self.state = replace(base, run_id=run_id, host=socket.gethostname(), pid=os.getpid(), finished=False)
        self._save()
        return previous if previous is not None and not previous.finished else None

    def _price_file(self) -> Path:
        folder = self.config.out or Path(tempfile.mkdtemp(prefix="raypipe-prices-"))
        return write_price_file(list(self.config.offers), Path(folder).resolve() / "prices.csv")

    # ----- placement -----
    def _candidates(self, exclude: set[str]) -> list[Offer]:
        now = time.time()
        return [o for o in ranked(list(self.config.offers))
                if o.label() not in exclude and not self.state.blocked(o.label(), now, self.config.block_s)]

    def _provision(self, preferred: Offer | None, exclude: set[str]) -> tuple[ClusterHandle, Offer]:
        """``preferred`` first, then every other offer not excluded nor blocked, cheapest first."""
        order = self._candidates(exclude)
        if preferred is not None:
            order = [preferred] + [o for o in order if o.label() != preferred.label()]
        tried = []
        for offer in order:
            cluster_id = f"{self.state.run_id}-c{self.state.clusters_made + 1}"
            self._save(clusters_made=self.state.clusters_made + 1)
            try:
                handle = self.provisioner.provision(offer.label(), cluster_id)
            except ProvisionError as exc:
                tried.append(offer.label())
                self.events.emit("provision_failed", offer=offer.label(), reason=" ".join(str(exc).split())[:300])
                self._save(failed_offers={**self.state.failed_offers, offer.label(): time.time()})
                continue
            self._save(owned=(*self.state.owned, handle))  # before anything else: a restart must find it
            self.events.emit("cluster_up", cluster=handle.cluster_id, offer=offer.label(), address=handle.gcs_address,
                             provider=handle.provider, session=handle.session, usd_per_hour=offer.usd_per_hour)
            self.billed[handle.cluster_id] = (time.time(), offer.usd_per_hour)
            return handle, offer
        raise RunFailed(2, f"no offer could be provisioned (tried: {', '.join(tried) or 'none left unblocked'})")

    def _place(self, preferred: Offer | None, exclude: set[str], resume: str, step: int | None) -> _Current:
        """Provision (with failover) and submit; a cluster whose Job API refuses the driver is one
        more failed offer: torn down, blocked, and the next one tried."""
        excluded = set(exclude)
        while True:
            handle, offer = self._provision(preferred, excluded)
            try:
                return self._submit(handle, offer, resume, step)
            except ProvisionError as exc:
                self.events.emit("provision_failed", offer=offer.label(), reason=" ".join(str(exc).split())[:300])
                self._save(failed_offers={**self.state.failed_offers, offer.label(): time.time()}, cluster=None, job_id=None)
                self._teardown(handle)
                excluded.add(offer.label())
                preferred = None

    def _env(self, handle: ClusterHandle, offer: Offer, resume: str, step: int | None) -> dict[str, str]:
        env = {"RAYPIPE_STORAGE": self.config.storage, "RAYPIPE_RUN_ID": self.state.run_id, "RAYPIPE_RESUME": resume,
               "RAYPIPE_CLUSTER": handle.cluster_id, "RAYPIPE_PRICES": str(self.prices), "RAYPIPE_OFFER": offer.label(),
               "RAY_ADDRESS": handle.gcs_address}
        at = self.config.price_change_at
        if at is not None and not self.state.price_migrated and (step is None or step < at):
            env["RAYPIPE_PRICE_EVENTS"] = f"{at}:{PRICE_FACTOR:g}"
        return env

    def _submit(self, handle: ClusterHandle, offer: Offer, resume: str, step: int | None) -> _Current:
        job = DriverJob.submit(handle, list(self.config.driver), self.config.working_dir,
                               self._env(handle, offer, resume, step), self.config.python, self.out)
        self._save(cluster=handle, job_id=job.job_id)  # first: a supervisor killed after saying it adopts this job
        self.events.emit("job_submitted", cluster=handle.cluster_id, job_id=job.job_id, resume=resume, offer=offer.label())
        job.follow()
        return _Current(handle, job, offer)

    def _teardown(self, handle: ClusterHandle) -> None:
        self.provisioner.teardown(handle)
        self._save(owned=tuple(h for h in self.state.owned if h.cluster_id != handle.cluster_id))
        kept = {"kept": True} if handle.provider == "existing" else {}  # the user's cluster: released, not stopped
        up = self.billed.pop(handle.cluster_id, None)
        usd = {"usd": round(up[1] * (time.time() - up[0]) / 3600.0, 6)} if up is not None else {}
        self.usd_clusters += usd.get("usd", 0.0)
        self.events.emit("cluster_down", cluster=handle.cluster_id, address=handle.gcs_address, **kept, **usd)

    def _spent(self, record: RunRecord | None) -> dict[str, float | int | None]:
        """What the run has cost: its clusters' time at their offers' prices (provisioning, start-up and migrations
        included: what a cloud bills), beside the jobs' own ledger (``usd_jobs``: the sum of their ``usd_job``).
        The total is the larger of the two (a supervisor restarted since knows only the clusters it made)."""
        now = time.time()
        clusters = self.usd_clusters + sum(rate * (now - up) / 3600.0 for up, rate in self.billed.values())
        live = record.live if record is not None else None
        jobs, samples = (live.usd_total, live.samples) if live is not None else (0.0, 0)
        total = max(clusters, jobs)
        return {"usd_total": round(total, 6), "usd_jobs": round(jobs, 6), "usd_clusters": round(clusters, 6),
                "usd_lost": live.usd_lost if live is not None else 0.0, "samples": samples,
                "usd_per_million_samples": round(total / samples * 1e6, 6) if samples and total else None}

    # ----- the loop -----
    def run(self) -> int:
        """Until the driver finishes (0), a user error is reported (its code), or nothing is left (1, 2).
        The first Ctrl-C stops the run (the job commits and stops, the cluster is torn down; 130); a second one
        detaches: the cluster and job are left running and the state says so, and the next ``orchestrator run`` on
        the same storage adopts them."""
        adopted = self._take_ownership()
        self.prices = self._price_file()
        previous = signal.signal(signal.SIGINT, self._interrupt) if threading.current_thread() is threading.main_thread() else None
        try:
            current = self._start(adopted)
            while True:
                following = self._watch(current)
                if following is None:
                    code = 0
                    break
                current = following
        except RunFailed as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = exc.code
            self._release_others(keep=None)  # nobody supervises them from here on
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if code == 0 and self.interrupted:
            code = 130
        self._save(finished=True)
        self._write_out()
        return code

    def _start(self, adopted: SupervisorState | None) -> _Current:
        if adopted is not None and adopted.cluster is not None:
            handle = adopted.cluster
            offer = self.by_label.get(handle.offer)
            if offer is not None and adopted.job_id and self.provisioner.alive(handle):
                job = DriverJob(handle, adopted.job_id, self.out)
                if job.status() not in (None, *TERMINAL):
                    self._release_others(keep=handle.cluster_id)  # a move's source, a target never used
                    self.events.emit("adopted", cluster=handle.cluster_id, job_id=adopted.job_id)
                    job.follow()
                    return _Current(handle, job, offer)
            self._release_others(keep=handle.cluster_id)
            return self._relaunch(handle, "supervisor restarted; its cluster or job is gone")
        self._release_others(keep=None)
        record = read_record(self.config.storage)
        step = newest_committed(self.config.storage, record.last_committed if record else None) if self.config.resume != "never" else None
        return self._place(None, set(), self.config.resume, step)

    def _release_others(self, keep: str | None) -> None:
        """Tear down every cluster the state owns but ``keep`` (the job's, adopted or relaunched from): an earlier
        supervisor killed mid-move left them up."""
        for handle in self.state.owned:
            if handle.cluster_id != keep:
                self.events.emit("cluster_released", cluster=handle.cluster_id, reason="owned by the supervisor before its restart, no longer needed")
                self._teardown(handle)

    def _interrupt(self, signum: int, frame: Any) -> None:
        """Ctrl-C: the first asks the run to stop (see :meth:`run`), the second detaches."""
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        print("[supervisor] stopping the run: the job commits its step and stops, then its cluster is torn down "
              "(Ctrl-C again detaches and leaves them running)", flush=True)

    def _watch(self, cur: _Current) -> _Current | None:
        """Poll until the current job ends or its cluster is lost; return what runs next (None: done)."""
        beat = 0.0
        asked = False
        while True:
            time.sleep(self.config.poll_s)
            if self.interrupted and not asked:  # the job honours it between steps (orchestrator stop writes the same)
                asked = True
                request_stop(self.config.storage, "Ctrl-C on orchestrator run")
                self.events.emit("stop_requested", cluster=cur.handle.cluster_id, by="Ctrl-C")
            try:  # a storage outage: the heartbeat and the record are read again at the next poll
                if time.monotonic() - beat > 5.0:
                    self._save(retry_s=0.0)  # a beat: skipped, not waited for
                    beat = time.monotonic()
                record = read_record(self.config.storage)
            except (StorageError, StorageFailed):
                record = None
            self._rehearse_kill(cur, record)
            status = cur.job.status()
            if (record and record.cluster == cur.handle.cluster_id and record.status in ("finished", "stopped")
                    and (status is None or status in TERMINAL)):
                self._done(cur, record)  # this cluster's job ended the run (its cluster may have gone after): not relaunched
                return None
            if status is None or not self.provisioner.alive(cur.handle):
                cur.unreachable_since = cur.unreachable_since or time.monotonic()
                if time.monotonic() - cur.unreachable_since >= self.config.unreachable_s:
                    return self._lost(cur, "head unreachable")
                continue
            cur.unreachable_since = None
            if status in TERMINAL:
                return self._ended(cur)

    def _rehearse_kill(self, cur: _Current, record: RunRecord | None) -> None:
        at = self.config.kill_cluster_at
        if at is None or self.state.killed or not record or record.steps_done < at:
            return
        self.events.emit("rehearsal_kill", cluster=cur.handle.cluster_id, steps_done=record.steps_done)
        self.provisioner.kill(cur.handle)
        self._save(killed=True)

    def _ended(self, cur: _Current) -> _Current | None:
        outcome = cur.job.outcome()
        cur.job.drain()
        record = read_record(self.config.storage)
        status = record.status if record else None
        if outcome.status == "SUCCEEDED" or status == "stopped":  # finished, or stopped (orchestrator stop, Ctrl-C,
            # ray job stop's SIGTERM: the job committed and recorded it): never relaunched
            self._done(cur, record)
            return None
        if status == "migrating" and outcome.exit_code == EXIT_MIGRATE:  # one constant with the job (orchestrator.elastic.signals)
            return self._migrate(cur, record)
        if status == "failed" and outcome.exit_code in USER_ERROR_EXITS:
            self._teardown(cur.handle)
            self._save(cluster=None, job_id=None)
            tail = redact_text(" | ".join(line for line in cur.job.lines[-5:] if line.strip()))
            raise RunFailed(int(outcome.exit_code or 1), f"the driver failed (exit {outcome.exit_code}), not relaunched: {tail}")
        if outcome.exit_code == EXIT_STORAGE:  # the run's storage, not this offer: relaunched, the offer not blocked
            return self._lost(cur, f"the storage did not take a checkpoint (exit {EXIT_STORAGE})", blame=False)
        return self._lost(cur, f"job {outcome.status} (exit {outcome.exit_code}) with the run {status or 'not started'}")

    def _done(self, cur: _Current, record: RunRecord | None) -> None:
        """The run finished or was stopped: said once with what it cost, its cluster torn down, nothing relaunched.
        The driver's last lines are printed first (its stream, or the job's full log): tearing the cluster down
        would cut them."""
        cur.job.drain()
        self.events.emit("run_stopped" if record and record.status == "stopped" else "run_finished", cluster=cur.handle.cluster_id,
                         steps_done=record.steps_done if record else None, **self._spent(record))
        self._teardown(cur.handle)
        self._save(cluster=None, job_id=None)

    def _lost(self, cur: _Current, why: str, blame: bool = True) -> _Current:
        cur.job.drain(2.0)
        return self._relaunch(cur.handle, why, blame)

    def _relaunch(self, handle: ClusterHandle, why: str, blame: bool = True) -> _Current:
        """Tear down what is left of ``handle`` and place the run again; ``blame``: the offer failed (blocked for
        ``block_s``), else the next placement may choose it again."""
        record = read_record(self.config.storage)
        step = newest_committed(self.config.storage, record.last_committed if record else None)
        self.events.emit("cluster_lost", cluster=handle.cluster_id, last_committed=step, reason=why)
        if blame:
            self._save(failed_offers={**self.state.failed_offers, handle.offer: time.time()})
        self._teardown(handle)  # whatever is left of it
        if self.state.recoveries >= self.config.max_recoveries:
            raise RunFailed(1, f"cluster {handle.cluster_id} lost ({why}); recovery budget of {self.config.max_recoveries} spent")
        self._save(recoveries=self.state.recoveries + 1, cluster=None, job_id=None)
        return self._place(None, {handle.offer} if blame else set(), "require" if step else "auto", step)

    def _migrate(self, cur: _Current, record: RunRecord | None) -> _Current:
        ask = record.migration if record else None
        step = ask.step if ask else (record.last_committed if record and record.last_committed else 0)
        reason = ask.reason if ask else "price"
        target = self.by_label.get(ask.target) if ask else None
        try:
            nxt = self._place(target, {cur.offer.label()}, "require", step)
        except RunFailed as exc:  # nowhere to go: stay where the job was, from the step it committed
            self.events.emit("migration_failed", reason=str(exc), cluster=cur.handle.cluster_id, step=step)
            return self._submit(cur.handle, cur.offer, "require", step)
        new, offer = nxt.handle, nxt.offer
        if reason == "price":
            self._save(price_migrated=True)
        self._wait_resumed(nxt, step)
        self.events.emit("migration", reason=reason, from_cluster=cur.handle.cluster_id, to_cluster=new.cluster_id,
                         step=step, from_offer=cur.offer.label(), to_offer=offer.label())
        self._teardown(cur.handle)
        return nxt

    def _wait_resumed(self, nxt: _Current, step: int) -> None:
        """Until the new job's ``job_started`` says it resumed from ``step`` (the old cluster is kept till then)."""
        deadline = time.monotonic() + self.config.resume_timeout_s
        while time.monotonic() < deadline:
            for e in merged_events(self.config.storage):
                if e.get("event") == "job_started" and e.get("cluster") == nxt.handle.cluster_id:
                    if e.get("resumed_from") != step:
                        raise RunFailed(1, f"the job on {nxt.handle.cluster_id} resumed from {e.get('resumed_from')}, not {step}")
                    return
            if nxt.job.status() in TERMINAL:
                return  # it ended before it said so: the loop reads how
            time.sleep(self.config.poll_s)
        raise RunFailed(1, f"the job on {nxt.handle.cluster_id} did not resume within {self.config.resume_timeout_s:.0f} s")

    def _write_out(self) -> None:
        if self.config.out is None:
            return
        try:
            events = merged_events(self.config.storage)
        except Exception as exc:  # noqa: BLE001 - the run's outcome stands; say why the log is missing
            print(f"[supervisor] could not read the run's events: {' '.join(str(exc).split())[:200]}", file=sys.stderr)
            return
        path = Path(self.config.out) / "events.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e, default=str) + "\n" for e in events))
