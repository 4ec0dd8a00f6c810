//! Waiting for messages in an event loop other than tokio's (asyncio, glib, epoll, mio): the
//! consumer's doorbell as a descriptor the loop watches, armed and disarmed around each wait.
//! The tokio side (`consumer/asynch.rs`, over `shm::wait_async`) does the same with its own reactor.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use super::Consumer;
use crate::memory::Memory;

impl<M: Memory> Consumer<M> {
    /// The consumer's doorbell, for an event loop to watch: a descriptor that becomes readable
    /// when the producer publishes or closes the ring while the consumer is
    /// [armed](Self::arm_doorbell). Bound on the first call; `None` where no doorbell can be
    /// bound (then poll [`try_recv`](Self::try_recv) on a timer). The loop only watches it:
    /// [`disarm_doorbell`](Self::disarm_doorbell) empties it.
    ///
    /// One wait, as an event loop runs it (here with `poll(2)`):
    ///
    /// 1. [`try_recv`](Self::try_recv); if a message (or an error) comes, done.
    /// 2. [`arm_doorbell`](Self::arm_doorbell), then `try_recv` once more: a message published
    ///    before arming knocked on nobody's door.
    /// 3. Wait until the doorbell is readable, or at most
    ///    [`liveness_interval`](Self::liveness_interval) (the next `try_recv` then checks that
    ///    the producer still runs, and reports `Disconnected` if it died).
    /// 4. [`disarm_doorbell`](Self::disarm_doorbell), and go back to 1.
    ///
    /// ```
    /// use std::os::fd::AsRawFd;
    /// use gpuring::{Consumer, Producer, TryRecvError};
    ///
    /// # let mut tx = Producer::builder("doc-consumer-doorbell").create()?;
    /// let rx = Consumer::open("doc-consumer-doorbell")?;
    /// let fd = rx.doorbell_fd().expect("a doorbell").as_raw_fd();
    /// std::thread::scope(|s| {
    ///     s.spawn(|| {
    ///         std::thread::sleep(std::time::Duration::from_millis(20));
    ///         tx.send(b"hi", b"").unwrap();
    ///     });
    ///     let msg = loop {
    ///         match rx.try_recv() {
    ///             Err(TryRecvError::Empty) => {}
    ///             other => break other,
    ///         }
    ///         rx.arm_doorbell();
    ///         match rx.try_recv() {
    ///             Err(TryRecvError::Empty) => {}
    ///             other => break other,
    ///         }
    ///         let mut fds = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
    ///         let ms = rx.liveness_interval().as_millis() as i32;
    ///         // SAFETY: one valid pollfd.
    ///         unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
    ///         rx.disarm_doorbell();
    ///     };
    ///     assert_eq!(&*msg.unwrap(), b"hi");
    /// });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn doorbell_fd(&self) -> Option<BorrowedFd<'_>> {
        self.ring.doorbell().map(AsFd::as_fd)
    }

    /// Arms the doorbell: from now on, until [`disarm_doorbell`](Self::disarm_doorbell), the
    /// producer knocks on [`doorbell_fd`](Self::doorbell_fd) after each publish and when it
    /// closes the ring. Arming twice is arming once. A consumer that leaves (drops) disarms.
    ///
    /// ```
    /// # let _tx = gpuring::Producer::builder("doc-consumer-arm").create()?;
    /// let rx = gpuring::Consumer::open("doc-consumer-arm")?;
    /// rx.arm_doorbell();
    /// assert!(matches!(rx.try_recv(), Err(gpuring::TryRecvError::Empty))); // look again
    /// // ... wait for doorbell_fd() to become readable ...
    /// rx.disarm_doorbell();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn arm_doorbell(&self) {
        self.ring.arm();
    }

    /// Disarms the doorbell (if armed) and empties it of knocks, so that the next wait starts
    /// quiet.
    ///
    /// ```
    /// # let _tx = gpuring::Producer::builder("doc-consumer-disarm").create()?;
    /// let rx = gpuring::Consumer::open("doc-consumer-disarm")?;
    /// rx.disarm_doorbell(); // not armed: only empties it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn disarm_doorbell(&self) {
        self.ring.disarm();
    }

    /// How often a waiting consumer checks that the producer still runs
    /// ([`ConsumerBuilder::liveness_interval`](crate::ConsumerBuilder::liveness_interval)): the
    /// longest an event loop should wait on the doorbell before it looks again.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # let _tx = gpuring::Producer::builder("doc-consumer-liveness").create()?;
    /// let b = gpuring::Consumer::builder("doc-consumer-liveness");
    /// let rx = b.liveness_interval(Duration::from_millis(50)).open()?;
    /// assert_eq!(rx.liveness_interval(), Duration::from_millis(50));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn liveness_interval(&self) -> Duration {
        self.ring.settings().liveness
    }
}
