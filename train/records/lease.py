"""One trainer per model_dir: a lease in `model_dir/lease.json`, renewed while the trainer runs.

The lease names its holder: {"owner": a random id, "host", "pid", "started", "heartbeat" (Unix
seconds), "timeout"}. A background thread rewrites it every `renew` seconds (default timeout/10)
with a new heartbeat. A second trainer that finds a live lease is refused with one line naming
the holder; a lease is *stale*, and is taken over with a message, when its heartbeat is older than
its timeout or when its holder ran on this host and its process is gone (kill -9). `--take_over`
takes over a live one too (the user says that trainer is gone, e.g. on a host that cannot be
reached); a holder that finds its lease taken stops before its next step or save (`LeaseLost`).
The lease is released (deleted) when the run ends, also on errors; under MultiWorkerMirrored only
the chief holds it.

Only tf.io.gfile is used, so it works on a bucket (gs://) as on a disk, and gfile has no
compare-and-swap: a trainer writes its lease, waits `settle` seconds, reads it back and goes on only
if it is still its own. Two trainers that start together both write; the later write wins and the
earlier writer reads the other's lease back and is refused. The window that remains: a trainer
whose write lands more than `settle` seconds after its own read of the lease (a store stalled for
that long) can miss a lease written in between, and both run. Heartbeats compare clocks across
hosts: they must agree to well within the timeout (NTP does).
"""

import dataclasses
import json
import os
import socket
import threading
import time
import uuid

from absl import flags

from tfxl.files import field_error, write_text_atomically
from tfxl.model_dir import ModelDir
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")

__all__ = ["Lease", "LeaseHeld", "LeaseLost", "LeaseParams", "define_flags", "params_from_flags"]


class LeaseHeld(ValueError):
    """Another live trainer holds the model_dir; the message names it and how to take over."""


class LeaseLost(ValueError):
    """This trainer's lease was taken over (--take_over); it stops without saving."""


# What a lease holds (tfxl.files.field_error): every field is written by `Lease._write`, so one
# missing or of another kind (null, a string, a time no clock reads) makes the lease unreadable.
LEASE_FIELDS = {"owner": "text", "host": "text", "pid": "integer", "started": "time",
                "heartbeat": "time", "timeout": "positive"}


@dataclasses.dataclass(frozen=True)
class LeaseParams:
    timeout: float = 300.0     # a lease without a heartbeat for this long is stale
    settle: float = 2.0        # write, wait this long, read back
    take_over: bool = False    # take over a live lease (its trainer is known to be gone)
    renew: float = None        # heartbeat interval; None: timeout / 10

    @property
    def renew_every(self):
        return self.renew if self.renew is not None else self.timeout / 10


def define_flags():
    flags.DEFINE_bool("take_over", False, "Take over the model_dir's lease from another trainer "
                      "that is still marked alive (its host is gone or unreachable); a dead "
                      "one's is taken over without it.")
    flags.DEFINE_float("lease_timeout", LeaseParams.timeout, "A model_dir's lease whose "
                       "heartbeat is older than this many seconds is stale and taken over "
                       "(heartbeats every tenth of it).")
    flags.DEFINE_float("lease_settle", LeaseParams.settle, "Seconds between writing the lease "
                       "and reading it back (two trainers starting together: one goes on).")


def params_from_flags(flag_values=flags.FLAGS):
    return LeaseParams(timeout=flag_values.lease_timeout, settle=flag_values.lease_settle,
                       take_over=flag_values.take_over)


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process, or a pid we cannot judge
    return True


class Lease:
    """The lease of `model_dir` for this process: `check`, then `acquire`; `release` at the end.

    log: where the take-over messages go.
    """

    def __init__(self, model_dir, params=None, log=print):
        self.model_dir, self.params, self.log = model_dir, params or LeaseParams(), log
        self.path = ModelDir(model_dir).lease
        self.owner = uuid.uuid4().hex
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.started = None
        self.lost = None  # why the lease was lost, once the heartbeat finds another owner
        self._stop = threading.Event()
        self._thread = None

    # -- reading ---------------------------------------------------------------------------------
    def read(self):
        """The lease on storage: a dict, None when there is none, or {"unreadable": why} (not
        JSON, or a field missing or of another kind: named)."""
        try:
            with tf.io.gfile.GFile(self.path, "rb") as f:
                raw = f.read()
        except tf.errors.NotFoundError:
            return None
        try:
            lease = json.loads(raw)
            if not isinstance(lease, dict):
                raise ValueError("not a lease")
        except (UnicodeDecodeError, ValueError) as err:
            return {"unreadable": str(err).splitlines()[0] if str(err) else "empty"}
        damage = field_error(lease, LEASE_FIELDS)
        return {"unreadable": damage} if damage else lease

    def stale(self, lease):
        """Why `lease` (someone else's) is stale, or None while its holder is alive."""
        if "unreadable" in lease:
            return f"{self.path} is unreadable ({lease['unreadable']})"
        age = time.time() - lease["heartbeat"]
        timeout = lease["timeout"]
        if age > timeout:
            return f"no heartbeat for {age:.0f} s (its timeout: {timeout:g} s)"
        if (lease["host"] == self.host and lease["pid"] != self.pid
                and not _process_alive(lease["pid"])):
            return f"its process {lease['pid']} on this host is gone"
        return None

    def describe(self, lease):
        age = time.time() - lease["heartbeat"]
        since = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(lease["started"]))
        return (f"host {lease.get('host')}, pid {lease.get('pid')}{since}, last heartbeat "
                f"{age:.0f} s ago")

    def check(self):
        """Refuses (LeaseHeld) while another live trainer holds the lease, unless take_over;
        reads only. Returns the other holder's lease to take over, or None."""
        lease = self.read()
        if lease is None or lease.get("owner") == self.owner:
            return None
        if self.stale(lease) is None and not self.params.take_over:
            raise LeaseHeld(
                f"--model_dir={self.model_dir} is in use by another trainer "
                f"({self.describe(lease)}; {self.path}); stop it first, or if it is gone, wait "
                f"until its lease expires ({lease['timeout']:g} s "
                "without a heartbeat) or restart with --take_over")
        return lease

    # -- writing ---------------------------------------------------------------------------------
    def _write(self):
        now = time.time()
        write_text_atomically(self.path, json.dumps({
            "owner": self.owner, "host": self.host, "pid": self.pid, "started": self.started,
            "heartbeat": now, "timeout": self.params.timeout}, indent=2) + "\n")

    def acquire(self):
        """Takes the lease (see the module docstring) and starts the heartbeat; LeaseHeld when
        another trainer holds it or took it at the same time."""
        previous = self.check()
        if previous is not None:
            why = ("--take_over" if "unreadable" not in previous and
                   self.stale(previous) is None else self.stale(previous))
            held = "" if "unreadable" in previous else f" ({self.describe(previous)})"
            self.log(f"taking over the lease of {self.model_dir} from another trainer{held}: "
                     f"{why}")
        tf.io.gfile.makedirs(self.model_dir)
        self.started = time.time()
        self._write()
        time.sleep(self.params.settle)
        lease = self.read()
        if lease is None or lease.get("owner") != self.owner:
            who = (self.describe(lease) if lease and "unreadable" not in lease
                   else "its lease is gone")
            raise LeaseHeld(f"--model_dir={self.model_dir}: another trainer took its lease at "
                            f"the same time ({who}); only one trainer runs per model_dir")
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name="tfxl-lease", daemon=True)
        self._thread.start()
        return self

    def _heartbeat(self):
        while not self._stop.wait(self.params.renew_every):
            try:
                lease = self.read()
                if lease is None or lease.get("owner") != self.owner:
                    holder = (self.describe(lease) if lease and "unreadable" not in lease
                              else "its lease is gone")
                    self.lost = f"another trainer took the lease of {self.model_dir} ({holder})"
                    return
                self._write()
            except (OSError, tf.errors.OpError):
                pass  # a failed renewal is retried at the next beat

    def ensure_held(self, step=None):
        """Raises LeaseLost once the heartbeat has found another owner (before each host loop's
        actions and each save: the trainer stops without writing)."""
        del step
        if self.lost:
            raise LeaseLost(f"{self.lost}; this trainer stops without saving")

    def release(self):
        """Stops the heartbeat and deletes the lease if it is still this trainer's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            try:
                lease = self.read()
                if lease is not None and lease.get("owner") == self.owner:
                    tf.io.gfile.remove(self.path)
            except (OSError, tf.errors.OpError):
                pass  # it expires by itself
