"""Zero-copy GPU (or host) frame rings between processes, as tensors through DLPack.

Consumers whose slots export zero-copy tensors (DLPack, ``__cuda_array_interface__``, the
buffer protocol), and a producer that publishes tensors. See docs/python.md.
"""

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Protocol, Self, TypeAlias, TypedDict, final, type_check_only

if sys.version_info >= (3, 13):
    from types import CapsuleType as _CapsuleType
else:
    _CapsuleType: TypeAlias = object

__all__ = [
    "__version__",
    "Consumer",
    "Slot",
    "Producer",
    "Error",
    "Disconnected",
    "ReleasedError",
    "ContextLostError",
    "EXIT_CONTEXT_LOST",
    "context_lost",
    "finish_gpu_work",
    "handle_sigterm",
    "tensor_header",
    "batch_table",
    "Batcher",
]

__version__: str

@type_check_only
class SupportsCudaStream(Protocol):
    """An object with a ``cuda_stream`` handle, such as a ``torch.cuda.Stream``."""

    @property
    def cuda_stream(self) -> int: ...

# What a dtype argument may be: a name ("uint8", "torch.float16", "<f4", "half"), a torch
# dtype, a numpy dtype or a numpy scalar type; anything whose ``str()`` (or ``__name__``)
# names one of bool, (u)int8/16/32/64, float16, bfloat16, float32, float64. Others raise
# TypeError.
_DTypeLike: TypeAlias = object

_Memory: TypeAlias = Literal["cuda", "host"]

class Error(Exception):
    """Something went wrong in a ring: it could not be created or opened, it is corrupt, or a CUDA call failed."""

class Disconnected(Error):
    """The producer closed the ring (or died) and every message was received.

    Raised by `recv`, it has `reason`: "closed" (the stream is complete), "died" (the
    producer's process ended without closing the ring, or it aborted: the stream was cut),
    "context lost" (the producer's GPU context was lost: the stream was cut, and a restarted
    producer makes the ring anew) or "gone" (not known: the segment was already removed).
    Raised when opening, it has none (`getattr(e, "reason", None)`)."""

    reason: Literal["closed", "died", "context lost", "gone"]

class ContextLostError(Error):
    """The GPU context of this process is lost: a kernel of it faulted or, under MPS, another
    client of the GPU crashed. No GPU work can run in the process any more, and every gpuring
    call from then on raises this (closing and releasing excepted, which raise nothing).

    Let it propagate and exit with `EXIT_CONTEXT_LOST` (75), for a supervisor to restart the
    process (docs/python.md, "A lost GPU context"). The message is the same from every call:
    "the GPU context of this process is lost (...)", naming the driver call that failed
    first."""

EXIT_CONTEXT_LOST: Final[int]
"""75 (`EX_TEMPFAIL`): the exit status for a process whose GPU context is lost, which
gpuring's command, examples and GStreamer elements use too."""

def context_lost() -> str | None:
    """None while this process's GPU context is not lost, else the message that
    `ContextLostError` carries. Once lost it stays lost."""

class ReleasedError(BufferError):
    """The slot was released: no new tensor, array or buffer can be made from it."""

def handle_sigterm(enable: bool) -> None:
    """Whether gpuring installs its SIGTERM handler when this process creates a producer or
    opens a consumer (default True; `GPURING_SIGTERM=0` in the environment makes it False).
    Call it before creating either.

    The handler is installed only on the main thread and never over a SIGTERM handler of the
    application's own. On SIGTERM it removes the names of the rings this process's live
    producers created, so `docker stop` or `systemctl stop` leaves nothing in /dev/shm (or the
    producers' `dir`), then raises `SystemExit(143)` in the main thread: `with` blocks and
    `finally` clauses run, and the process exits with status 143 (128 + SIGTERM) instead of
    dying mid-kernel. A `recv` or `send` blocked in the main thread gives way within about
    100 ms. Consumers of its producers see the stream cut (`ended == "died"`).

    At exit, whether or not the handler is installed, gpuring closes the producers and
    consumers still open, then waits until no GPU work of the process runs
    (`finish_gpu_work`). An application with a SIGTERM handler of its own should do the same
    before it exits: close its consumers and producers, then call `finish_gpu_work()`."""

def finish_gpu_work() -> None:
    """Waits until every GPU this process used through gpuring has no work of this process
    left running: gpuring's, and torch's (the same primary CUDA context).

    The last step of a graceful stop, after closing consumers and producers: a process that
    exits while its kernels run has them torn down mid-flight, and under MPS that faults every
    other client of the GPU. gpuring does it at exit; call it from a SIGTERM handler of your
    own. Returns at once where no GPU was used. Raises `ContextLostError` if the context is
    lost, `Error` if a CUDA call fails."""

def tensor_header(dtype: _DTypeLike, shape: Sequence[int]) -> bytes:
    """The tensor header for `dtype` and `shape`.

    Put it at the start of a message's user header so that consumers' slots take that type
    and shape. `shape`: non-negative ints, at most 8 of them.
    """

class _BatchCamera(TypedDict):
    seq: int
    timestamp_ns: int
    skipped: int
    epoch: int
    state: Literal["present", "stale", "absent", "refused"]

class _BatchTable(TypedDict):
    batch: int
    closed_ns: int
    cameras: list[_BatchCamera]

class _BatchCounts(TypedDict):
    present: int
    stale: int
    absent: int
    refused: int

class _BatchTotals(TypedDict):
    batches: int
    cameras: list[_BatchCounts]

@final
class Batcher:
    """Batches camera rings `inputs` into ring `ring` (docs/batching.md), on a thread of its
    own, until `stop()` or the end of a `with` block: each message of `ring` is a `[K, ...frame]`
    tensor (the camera's frames, in the order of `inputs`) with a table that says what each
    camera's place holds (`batch_table`).

    A batch goes out when every live camera has a new frame in it or `max_wait` seconds after
    its first one, or, with `rate`, that many times a second. A camera with nothing new keeps
    its last frame (`fill="previous"`) or zeros (`fill="zeros"`). `mode`: "latest" (a batch
    takes each camera's newest frame) or "lossless" (every frame goes into a batch).
    `memory`: "host" or "cuda" (the cameras' rings and `ring`, on GPU `device`). `dtype` and
    `shape`: every camera's frame; default: the first frame's tensor header says. Settings
    it cannot run with raise `ValueError`.
    """

    def __new__(
        cls,
        ring: str,
        inputs: Sequence[str],
        *,
        max_wait: float = 0.05,
        rate: float | None = None,
        fill: Literal["previous", "zeros"] = "previous",
        mode: Literal["latest", "lossless"] = "latest",
        memory: Literal["host", "cuda"] = "host",
        device: int = 0,
        dtype: _DTypeLike | None = None,
        shape: Sequence[int] | None = None,
        capacity: int = 4,
        spares: int = 4,
        dir: str | os.PathLike[str] | None = None,
    ) -> Self: ...
    def stop(self) -> _BatchTotals | None:
        """Stops it (within 50 ms) and returns the batches published and, per camera, how
        many it was present, stale, absent and refused in. Raises `gpuring.Error` if it had
        stopped on a failure of its own. A second call returns None."""
    @property
    def running(self) -> bool:
        """Whether it still runs."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> Literal[False]: ...

def batch_table(header: bytes | bytearray | memoryview) -> _BatchTable | None:
    """The table a batcher (`gpuring batch`, docs/batching.md) writes in each batch's user
    header (`slot.header`), camera by camera: the sequence number and timestamp of the frame
    in its place (timestamp 0: its place holds zeros), frames skipped since its last batch,
    its producer's epoch and its state. None if the message is not a batch; `ValueError` if
    the table is damaged. The batch itself is `slot.torch()`: a `[K, ...frame]` tensor.
    """

@final
class Consumer:
    """Opens ring `name` as a consumer, in whatever memory (CUDA or host) the producer chose.

    - `stream` (CUDA rings): the stream, as an int handle or an object with `cuda_stream`
      (a `torch.cuda.Stream`), that waits for each message and records its release. Default:
      the legacy default stream, which is PyTorch's current stream unless you changed it.
    - `dtype`, `shape`: the layout of every message's tensors (one dimension may be -1);
      default: the message's tensor header, else a 1-D uint8 array of its bytes.
    - `device` (CUDA rings): the GPU to read on; default the ring's.
    - `start`: "newest" (default, the newest message still in the ring), "next" (only
      messages published after joining) or "oldest".
    - `mode`: how it receives. "lossless" (every message; the producer waits for it), "queue"
      (every message while it keeps up; when lapped it loses the oldest and `lag` says how
      many) or "latest" (each receive returns the newest message, skipping older unread ones,
      counted in `lag`: what a live inference consumer wants). Default: the ring's policy's
      ("block": lossless, "overwrite": queue).
    - `wait`: seconds to wait for the ring to appear (or for a live producer to replace a
      dead one's).
    - `allow_foreign_owner`: open a ring whose segment another user owns (its producer made it
      readable and writable for us with `permissions=`). Refused by default.
    - `dir`: the directory to find the ring in, as this process sees the producer's; default
      the `GPURING_DIR` environment variable if set, else `/dev/shm`.

    Iterating yields messages until the producer closes the ring. Opening one installs
    gpuring's SIGTERM handler (see `handle_sigterm`), and a consumer still open at exit is
    closed then.
    """

    def __new__(
        cls,
        name: str,
        stream: int | SupportsCudaStream | None = None,
        *,
        dtype: _DTypeLike | None = None,
        shape: Sequence[int] | None = None,
        device: int | None = None,
        start: Literal["newest", "next", "oldest"] = "newest",
        mode: Literal["lossless", "queue", "latest"] | None = None,
        wait: float = 0.0,
        allow_foreign_owner: bool = False,
        dir: str | os.PathLike[str] | None = None,
    ) -> Self: ...
    def recv(self, timeout: float | None = None) -> Slot:
        """The next message, waiting at most `timeout` seconds (None: as long as it takes).

        Raises `TimeoutError` when the time is up, `gpuring.Disconnected` once the producer
        has closed the ring (or died) and every message was received.
        """

    def try_recv(self) -> Slot | None:
        """The next message if one is waiting, else None."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> Slot:
        """Iterating yields messages until the producer closes the ring (or dies: `ended`
        tells which)."""

    async def recv_async(self, timeout: float | None = None) -> Slot:
        """`recv` for asyncio: awaits the next message without blocking the event loop or
        starting a thread (the running loop watches the consumer's doorbell). Raises as `recv`
        does; cancelling it loses no message."""

    def __aiter__(self) -> Self: ...
    async def __anext__(self) -> Slot:
        """`async for` yields messages until the producer closes the ring (or dies: `ended`
        tells which)."""

    @property
    def ended(self) -> Literal["closed", "died", "context lost"] | None:
        """How the stream ended: None while the producer is live, "closed" if it closed the
        ring (the stream is complete), "died" if its process ended without closing it (the
        stream was cut), "context lost" if its GPU context was lost (the stream was cut; a
        restarted producer makes the ring anew). Ask after iteration ends or `recv` raised
        `Disconnected`."""

    def close(self) -> None:
        """Leaves the ring. Slots still held keep it open until they are released.

        A CUDA consumer first waits for its queued reads, then (up to 0.5 s) for the producer to
        let go of its release events, without holding the GIL.
        """

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> Literal[False]: ...
    @property
    def name(self) -> str:
        """The ring's name."""

    @property
    def dir(self) -> Path:
        """The ring directory the ring was opened in (absolute)."""

    @property
    def memory(self) -> _Memory:
        """Either "cuda" or "host"."""

    @property
    def device(self) -> int | None:
        """The GPU this consumer reads on; None for host rings."""

    @property
    def capacity(self) -> int:
        """Slots in the ring."""

    @property
    def mode(self) -> Literal["lossless", "queue", "latest"]:
        """This consumer's delivery mode."""

    @property
    def slot_size(self) -> int:
        """Largest message in bytes."""

    @property
    def header_size(self) -> int:
        """Bytes of user header per message."""

    @property
    def stream(self) -> int | None:
        """The stream messages are ready on (DLPack numbering: 1 is the legacy default stream); None for host rings."""

@final
class Slot:
    """A received message.

    The message is held (the producer cannot overwrite it) until the slot is released and
    every tensor or buffer made from it is freed. Slots come from `Consumer.recv`,
    `Consumer.try_recv` and iteration; they cannot be made directly.

    Tensors, arrays and buffers made from it are the ring's memory itself, shared with every
    other consumer and the producer: treat them as read-only. Writing through them corrupts
    the frame that other consumers read. Only the buffer protocol enforces it, and numpy
    marks its arrays read-only (from the buffer protocol or DLPack); torch tensors and
    CuPy and Numba arrays are writable.
    """

    @property
    def seq(self) -> int:
        """Sequence number of the message (0 for the producer's first)."""

    @property
    def timestamp_ns(self) -> int:
        """When the producer published it, in CLOCK_MONOTONIC nanoseconds."""

    @property
    def lag(self) -> int:
        """Messages lost just before this one (overwritten before this consumer read them)."""

    @property
    def header(self) -> bytes:
        """The message's user header, as the producer wrote it."""

    def __len__(self) -> int:
        """Length of the message in bytes."""

    def __bool__(self) -> Literal[True]:
        """A slot is true even when its message is empty (`if slot := rx.try_recv():`)."""

    @property
    def memory(self) -> _Memory:
        """Either "cuda" or "host"."""

    @property
    def ptr(self) -> int:
        """Address of the message's first byte (device address for CUDA rings)."""

    @property
    def stream(self) -> int | None:
        """The CUDA stream the message is ready on (and its release is recorded on), as DLPack numbers it (1: the legacy default stream); None for host rings."""

    @property
    def dtype(self) -> str:
        """Element type the exports use (see `view`)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape the exports use (see `view`)."""

    @property
    def released(self) -> bool:
        """Whether `release()` was called."""

    def view(self, dtype: _DTypeLike | None = None, shape: Sequence[int] | None = None) -> Slot:
        """Sets the element type and shape that tensors, arrays and buffers made from this slot will have (one dimension may be -1), and returns the slot.

        `torch.from_dlpack(slot.view("uint8", (1080, 1920, 4)))`.
        """

    def release(self) -> None:
        """Ends this slot's hold on the message.

        Tensors and buffers made from it before keep it held until they are freed; new ones
        are refused. Calling it twice is harmless.
        """

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> Literal[False]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> _CapsuleType:
        """A DLPack capsule of the message, for `torch.from_dlpack` / `numpy.from_dlpack`.

        On a CUDA ring, work on `stream` (a CUDA stream handle; None or 1 for the legacy
        default stream, -1 for no ordering at all) is ordered after the producer's writes, and
        the release waits for work queued on it.
        """

    def torch(self) -> Any:
        """The message as a torch tensor, without a copy: the tensor `torch.from_dlpack(slot)`
        makes, ordered as it orders it (on a CUDA ring, torch's current stream waits for the
        producer's writes, and the release waits for the work queued there), at a fraction of
        its cost: torch's own DLPack import is called directly. `ImportError` without torch."""

    def __dlpack_device__(self) -> tuple[int, int]:
        """(device_type, device_id): (2, ordinal) for CUDA, (1, 0) for host."""

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """numpy's fallback when the buffer protocol refuses: `ReleasedError` for a released
        slot, `BufferError` for device memory; a live host slot's zero-copy view otherwise."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3) of the message: CUDA rings only.

        Once read, the message stays held until this slot object is freed (its readers keep
        a reference).

        `data` is `(ptr, False)`: not flagged read-only, since torch refuses the flag and CuPy
        and Numba ignore it, but the memory is shared with every other consumer and the
        producer, so do not write to it: that corrupts the frame the others read.
        """
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview:
            """The buffer protocol, read-only: host rings only."""

        def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class Producer:
    """Creates ring `name` and publishes into it.

    `memory`: "cuda" (slots on GPU `device`), "host", or "auto" (CUDA where a GPU is usable).
    `policy`: the delivery mode of consumers that do not choose one: "block" (lossless: the
    producer waits for the slowest) or "overwrite" (queue: no wait for slow readers; they lose
    messages). `spares`: spare buffers the producer swaps in when it laps a message a consumer
    still holds, so a consumer that holds frames never slows it down; only when consumers hold
    every spare does it wait (default 8, fewer where the ring's limits leave less room).
    `sharing` (CUDA rings): "legacy" (IPC handles in the ring, which any process that can read
    it may map) or "vmm" (memory handed out by file descriptor to processes of this uid only, or
    also of the uids in `allow_uids` and the groups in `allow_gids`; a refused consumer gets
    `PermissionError`). `fence` (CUDA rings): how GPU work is ordered across processes:
    "auto" (memory words where the GPU can use 64-bit stream memory operations, else events),
    "events" (interprocess CUDA events) or "memory" (sequence words in the ring's segment; no
    IPC event is made, so it works for consumers in containers with their own /dev/shm or pid
    namespace, where events do not: docs/containers.md); VMM sharing always fences with memory
    words, whatever `fence` says. `permissions`: the ring's file mode (default 0o600: this user
    only); consumers of other users need read and write (for example 0o666, and
    `Consumer(..., allow_foreign_owner=True)`). `dir`: the directory the ring's file and sockets
    go in (default the `GPURING_DIR` environment variable if set, else `/dev/shm`); consumers
    pass the same directory, as they see it (for containers: a volume both mount). The ring is
    removed when the producer is closed or freed. Creating one installs gpuring's SIGTERM
    handler (see `handle_sigterm`), and a producer still open at exit is closed then.
    """

    def __new__(
        cls,
        name: str,
        slot_size: int,
        *,
        capacity: int = 8,
        header_size: int = 64,
        memory: Literal["auto", "cuda", "host"] = "auto",
        device: int = 0,
        policy: Literal["block", "overwrite"] = "block",
        max_consumers: int | None = None,
        spares: int | None = None,
        sharing: Literal["legacy", "vmm"] = "legacy",
        fence: Literal["auto", "events", "memory"] = "auto",
        allow_uids: list[int] | None = None,
        allow_gids: list[int] | None = None,
        permissions: int | None = None,
        dir: str | os.PathLike[str] | None = None,
    ) -> Self: ...
    def send(
        self,
        data: Any,
        header: bytes | bytearray | None = None,
        *,
        stream: int | SupportsCudaStream | None = None,
        timeout: float | None = None,
    ) -> int:
        """Copies `data` into the next slot and publishes it; returns its sequence number.

        - CUDA rings: `data` is a contiguous CUDA tensor or array (anything with
          `__cuda_array_interface__`, such as a torch tensor without grad) on the ring's GPU.
          The copy goes on `stream` (an int handle or a `torch.cuda.Stream`; default: for a
          torch tensor torch's current stream on its device, else the legacy default stream),
          so it follows the work that produced `data`, and the message is ready for consumers
          when the copy is done. The CPU does not wait.
        - Host rings: `data` is any contiguous buffer (bytes, numpy array, memoryview) or a
          torch CPU tensor.

        `header`: the user header (bytes). Default: the tensor header of `data`'s type and
        shape, when the ring's header has room, so consumers' tensors get them.
        `timeout`: seconds to wait for a free slot (None: as long as it takes); then
        `TimeoutError`.
        """

    def abort(self) -> None:
        """Closes the ring as cut: consumers receive what was published, then `Disconnected`,
        and their `ended` says "died", not "closed" (for a job that failed part-way). Leaving a
        `with` block by an exception does the same."""

    def close(self) -> None:
        """Closes the ring: consumers receive what was published, then `gpuring.Disconnected`.

        A CUDA producer first waits (up to its linger, 5 s) for consumers to finish reading,
        without holding the GIL.
        """

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> Literal[False]: ...
    @property
    def name(self) -> str:
        """The ring's name."""

    @property
    def dir(self) -> Path:
        """The ring directory the ring was created in (absolute)."""

    @property
    def memory(self) -> _Memory:
        """Either "cuda" or "host"."""

    @property
    def published(self) -> int:
        """Messages published so far."""

    @property
    def consumer_count(self) -> int:
        """Consumers currently joined."""

    def wait_for_consumers(self, n: int, timeout: float | None = None) -> int:
        """Waits until at least `n` consumers have joined (messages sent before a consumer
        joins never reach it: a lossless job starts its consumers first and waits here), at
        most `timeout` seconds (None: as long as it takes), then `TimeoutError`. Returns how
        many joined."""

    @property
    def slot_size(self) -> int:
        """Largest message in bytes."""
