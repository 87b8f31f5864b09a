"""Every error Tempering raises, in one tree.

    TemperingError
    ├── ConfigError (ValueError)              a bad value in a spec, a task or a command line
    ├── SandboxError                          anything at the sandbox boundary
    │   ├── SandboxUnavailableError (RuntimeError)   the backend cannot run on this host
    │   ├── SandboxStartError                  a sandbox failed to start
    │   ├── SandboxClosedError                 the sandbox (or session) is closed or died
    │   ├── SandboxTimeoutError (TimeoutError) the sandbox stopped answering
    │   ├── SandboxPathError (ValueError)      a path leaves the sandbox or is not a plain file
    │   │   ├── SandboxFileNotFoundError (FileNotFoundError)   nothing at that path
    │   │   └── SandboxFileTooLargeError          a file is larger than the caller's limit
    │   ├── SandboxNotFoundError (LookupError) no sandbox under that id
    │   └── ResourceExhaustedError             the pool is full (and waiting was not asked for)
    ├── VerifierError                         grading could not produce a result
    ├── SchedulerError                        scheduling and resources
    │   ├── QueueFullError                     back-pressure: the queue is at its bound
    │   └── WorkerLostError                    the worker running a job died or went silent
    ├── StorageError                          trajectory storage
    └── PolicyError                           inference engines
        └── PolicyTimeoutError (TimeoutError)  the engine or server did not answer in time

Each error mixes in the builtin a caller would naturally catch, so ``except ValueError`` still
sees a bad path. Messages name the offending value and say what to do.
"""


class TemperingError(Exception):
    """Root of every error raised by Tempering."""


class ConfigError(TemperingError, ValueError):
    """A configuration value is invalid."""


class SandboxError(TemperingError):
    """Something went wrong at the sandbox boundary."""


class SandboxUnavailableError(SandboxError, RuntimeError):
    """The requested backend cannot run on this host (missing tool, kernel feature, privilege)."""


class SandboxStartError(SandboxError):
    """A sandbox could not be started."""


class SandboxClosedError(SandboxError):
    """The sandbox or shell session is closed, or died underneath the caller."""


class SandboxTimeoutError(SandboxError, TimeoutError):
    """The sandbox did not answer a call within its grace period (frozen, overloaded, lost).

    Not a command that ran long: that is the command's own timeout, reported in its result.
    """


class SandboxPathError(SandboxError, ValueError):
    """A path given to the file API leaves the sandbox or names something that is not allowed."""


class SandboxFileNotFoundError(SandboxPathError, FileNotFoundError):
    """Nothing exists at the given path inside the sandbox."""

    def __str__(self) -> str:  # OSError would format (errno, strerror) otherwise
        return str(self.args[0]) if self.args else ""


class SandboxFileTooLargeError(SandboxPathError):
    """A file read or downloaded from a sandbox is larger (apparent or allocated size) than the
    limit the caller allowed; nothing of it was loaded."""


class SandboxNotFoundError(SandboxError, LookupError):
    """No sandbox is known under the given id."""

    def __str__(self) -> str:  # LookupError would quote the message like a dict key
        return str(self.args[0]) if self.args else ""


class ResourceExhaustedError(SandboxError):
    """No sandbox can be handed out: the pool is at ``max_instances``."""


class VerifierError(TemperingError):
    """Grading could not produce a result."""


class SchedulerError(TemperingError):
    """Scheduling or resource accounting failed."""


class QueueFullError(SchedulerError):
    """The scheduler's queue is at ``max_queued`` and the caller asked not to wait."""


class WorkerLostError(SchedulerError):
    """The worker running a job died or stopped answering; the job may run again elsewhere."""


class StorageError(TemperingError):
    """Trajectory storage failed."""


class TrainingCollapsed(TemperingError):
    """A training run collapsed and its config says to stop (``on_collapse: stop``), or it
    collapsed again after its last allowed rollback; the message is the diagnosis."""


class PolicyError(TemperingError):
    """An inference engine failed."""


class PolicyTimeoutError(PolicyError, TimeoutError):
    """An inference engine or server did not answer within its timeout, retries included."""
