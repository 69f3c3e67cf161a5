//! The io_uring engine. One dedicated thread owns the ring; async callers hand it requests over
//! a channel, each with a `tokio::sync::oneshot` sender for the result, and ring an eventfd so
//! the thread wakes up (the ring keeps a poll on that eventfd armed, so the thread only ever
//! blocks in `io_uring_enter`).
//!
//! Invariants:
//! - At most `queue_depth` operations are in the kernel at once; the rest wait in a queue. The
//!   ring has one spare entry for the eventfd poll and its completion queue is twice as large,
//!   so neither queue can overflow.
//! - A request's buffer and its `Arc<File>` live in a slot of the thread until the kernel has
//!   completed the operation, whatever happens to the caller; buffers never move while the
//!   kernel may touch them (a `Vec`'s or `Bytes`' heap storage does not move with its handle).
//! - A short read or write is resubmitted for the remainder; a read that reaches end of file
//!   returns what it read. EINTR/EAGAIN are resubmitted as they are.
//! - Dropping the engine closes the channel and wakes the thread, which finishes every accepted
//!   request and exits; `Drop` joins it.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use io_uring::{opcode, squeue, types, IoUring};
use tokio::sync::oneshot;

use super::{aligned_span, cut, AlignedBuf, IoEngine, IoFuture, DIRECT_ALIGN};

/// `user_data` of the eventfd poll; request slots use small indexes.
const WAKE: u64 = u64::MAX;
/// Largest single read or write handed to the kernel; longer ones continue as "short" I/O
/// (a multiple of [`DIRECT_ALIGN`], so `O_DIRECT` reads continue aligned).
const MAX_IO: usize = 1 << 30;
/// Largest queue depth accepted (the config allows 1..=4096).
const MAX_DEPTH: u32 = 4096;
/// Bytes of each registered buffer: a 1 MiB shard with its header, aligned, fits.
pub const FIXED_BUFFER_BYTES: usize = (1 << 20) + (64 << 10);

/// io_uring on a dedicated thread.
pub struct UringEngine {
    requests: Option<mpsc::Sender<Request>>,
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    depth: u32,
    fixed: usize,
    /// O_DIRECT reads that went into a registered buffer.
    fixed_reads: Arc<AtomicU64>,
}

impl UringEngine {
    /// Set up a ring that keeps up to `queue_depth` operations in flight, and its thread.
    pub fn new(queue_depth: u32) -> io::Result<UringEngine> {
        UringEngine::with_fixed_buffers(queue_depth, 0)
    }

    /// Like [`UringEngine::new`], with `fixed` buffers of [`FIXED_BUFFER_BYTES`] registered
    /// with the ring (`IORING_REGISTER_BUFFERS`) for `O_DIRECT` reads: the kernel maps them
    /// once instead of pinning the pages of every read's buffer, and no buffer is allocated per
    /// read. A read finds a free one or, when all are busy or it is larger, uses its own. The
    /// buffers are locked memory: if the kernel refuses them (`RLIMIT_MEMLOCK` for an
    /// unprivileged process) the engine runs without, with a warning.
    pub fn with_fixed_buffers(queue_depth: u32, fixed: usize) -> io::Result<UringEngine> {
        let depth = queue_depth.clamp(1, MAX_DEPTH);
        let ring = IoUring::new(depth + 1)?;
        let pool = FixedPool::register(&ring, fixed.min(u16::MAX as usize));
        let fixed = pool.bufs.len();
        let wake = Arc::new(EventFd::new()?);
        let (requests, rx) = mpsc::channel();
        let fixed_reads = Arc::new(AtomicU64::new(0));
        let worker = Worker::new(ring, pool, depth as usize, rx, wake.clone(), fixed_reads.clone());
        let thread = std::thread::Builder::new().name("cairn-uring".into()).spawn(move || worker.run())?;
        Ok(UringEngine { requests: Some(requests), wake, thread: Some(thread), depth, fixed, fixed_reads })
    }

    /// How many registered buffers the ring has (0: none asked for, or refused).
    pub fn fixed_buffers(&self) -> usize {
        self.fixed
    }

    /// How many `O_DIRECT` reads went into a registered buffer so far.
    pub fn fixed_reads(&self) -> u64 {
        self.fixed_reads.load(Ordering::Relaxed)
    }

    /// Operations the ring keeps in flight at most.
    pub fn queue_depth(&self) -> u32 {
        self.depth
    }

    fn submit<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<io::Result<T>>) -> Request,
    ) -> IoFuture<T> {
        let (reply, result) = oneshot::channel();
        // A failed send drops the request and with it `reply`, so `result` reports the stop.
        let sent = self.requests.as_ref().is_some_and(|tx| tx.send(make(reply)).is_ok());
        if sent {
            self.wake.notify();
        }
        Box::pin(async move {
            result.await.unwrap_or_else(|_| Err(io::Error::other("the io_uring engine thread has stopped")))
        })
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        self.submit(|reply| Request::Read { file, offset, buf: Vec::with_capacity(len), len, reply })
    }

    fn read_at_direct(&self, file: Arc<File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        let (start, span) = aligned_span(offset, len);
        self.submit(|reply| Request::ReadDirect {
            file,
            start,
            span,
            buf: DirectBuf::Unplaced,
            offset,
            len,
            reply,
        })
    }

    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> IoFuture<()> {
        self.submit(|reply| Request::Write { file, offset, data, done: 0, reply })
    }

    fn fsync(&self, file: Arc<File>) -> IoFuture<()> {
        self.submit(|reply| Request::Fsync { file, reply })
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.requests = None;
        self.wake.notify();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the io_uring engine thread panicked");
            }
        }
    }
}

/// A non-blocking eventfd: callers add to it, the ring thread polls and drains it.
struct EventFd(OwnedFd);

impl EventFd {
    fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory arguments; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a valid descriptor nobody else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A failure can only be EAGAIN on a counter near
        // overflow, which still leaves the eventfd readable, so the thread wakes either way.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN (already drained) is harmless.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

/// One operation, with everything the kernel touches kept alive until it completes.
enum Request {
    Read {
        file: Arc<File>,
        offset: u64,
        buf: Vec<u8>,
        len: usize,
        reply: oneshot::Sender<io::Result<Vec<u8>>>,
    },
    /// An `O_DIRECT` read of the aligned `span` from `start` into `buf`; the caller gets the
    /// `len` bytes at `offset` out of it.
    ReadDirect {
        file: Arc<File>,
        start: u64,
        span: usize,
        buf: DirectBuf,
        offset: u64,
        len: usize,
        reply: oneshot::Sender<io::Result<Vec<u8>>>,
    },
    Write {
        file: Arc<File>,
        offset: u64,
        data: Bytes,
        done: usize,
        reply: oneshot::Sender<io::Result<()>>,
    },
    Fsync {
        file: Arc<File>,
        reply: oneshot::Sender<io::Result<()>>,
    },
}

/// Where an `O_DIRECT` read lands.
enum DirectBuf {
    /// Not submitted yet: placed by the ring thread when it is.
    Unplaced,
    /// A buffer of its own.
    Own(AlignedBuf),
    /// Registered buffer `index` of the ring thread's pool, at address `addr` (kept as an
    /// integer so the request stays `Send`), `filled` bytes so far.
    Fixed { index: u16, addr: usize, filled: usize },
}

impl DirectBuf {
    fn filled(&self) -> usize {
        match self {
            DirectBuf::Unplaced => 0,
            DirectBuf::Own(b) => b.filled(),
            DirectBuf::Fixed { filled, .. } => *filled,
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            DirectBuf::Unplaced => {}
            DirectBuf::Own(b) => b.advance(n),
            DirectBuf::Fixed { filled, .. } => *filled += n,
        }
    }
}

/// The registered buffers, owned by the ring thread next to the ring (which is declared, and
/// so dropped, first: the kernel lets go of them before they are freed).
struct FixedPool {
    bufs: Vec<AlignedBuf>,
    free: Vec<u16>,
}

impl FixedPool {
    fn register(ring: &IoUring, count: usize) -> FixedPool {
        let none = FixedPool { bufs: Vec::new(), free: Vec::new() };
        if count == 0 {
            return none;
        }
        let mut bufs: Vec<AlignedBuf> = (0..count).map(|_| AlignedBuf::new(FIXED_BUFFER_BYTES)).collect();
        let iovecs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.base_ptr().cast(), iov_len: FIXED_BUFFER_BYTES })
            .collect();
        // SAFETY: each iovec covers a live allocation of FIXED_BUFFER_BYTES that the pool keeps,
        // unmoved (the heap block does not move with its handle), until after the ring is gone.
        match unsafe { ring.submitter().register_buffers(&iovecs) } {
            Ok(()) => FixedPool { free: (0..count as u16).rev().collect(), bufs },
            Err(e) => {
                tracing::warn!(
                    "io_uring: cannot register {count} buffers of {FIXED_BUFFER_BYTES} bytes ({e}); \
                     O_DIRECT reads use buffers of their own"
                );
                none
            }
        }
    }
}

/// What a request needs after a completion.
enum Next {
    Resubmit(Request),
    Done,
}

impl Request {
    /// Whether there is nothing left to ask the kernel (zero-length reads and writes).
    fn is_complete(&self) -> bool {
        match self {
            Request::Read { buf, len, .. } => buf.len() == *len,
            Request::ReadDirect { buf, span, .. } => buf.filled() >= *span,
            Request::Write { data, done, .. } => *done == data.len(),
            Request::Fsync { .. } => false,
        }
    }

    /// The submission entry for what remains of this request.
    fn entry(&mut self, slot: usize) -> squeue::Entry {
        let entry = match self {
            Request::Read { file, offset, buf, len, .. } => {
                let filled = buf.len();
                let want = (*len - filled).min(MAX_IO) as u32;
                // SAFETY: `filled <= capacity`, so the pointer stays inside the allocation.
                let ptr = unsafe { buf.as_mut_ptr().add(filled) };
                opcode::Read::new(types::Fd(file.as_raw_fd()), ptr, want)
                    .offset(*offset + filled as u64)
                    .build()
            }
            Request::ReadDirect { file, start, span, buf, .. } => {
                let filled = buf.filled();
                let want = (*span - filled).min(MAX_IO) as u32;
                let fd = types::Fd(file.as_raw_fd());
                let at = *start + filled as u64;
                match buf {
                    DirectBuf::Fixed { index, addr, .. } => {
                        let ptr = (*addr + filled) as *mut u8;
                        opcode::ReadFixed::new(fd, ptr, want, *index).offset(at).build()
                    }
                    DirectBuf::Own(b) => opcode::Read::new(fd, b.spare_ptr(), want).offset(at).build(),
                    // `Worker::push` places every read before it asks for its entry.
                    DirectBuf::Unplaced => unreachable!("an O_DIRECT read submitted without a buffer"),
                }
            }
            Request::Write { file, offset, data, done, .. } => {
                let want = (data.len() - *done).min(MAX_IO) as u32;
                let ptr = data[*done..].as_ptr();
                opcode::Write::new(types::Fd(file.as_raw_fd()), ptr, want)
                    .offset(*offset + *done as u64)
                    .build()
            }
            Request::Fsync { file, .. } => opcode::Fsync::new(types::Fd(file.as_raw_fd())).build(),
        };
        entry.user_data(slot as u64)
    }

    /// Account for a completion with kernel result `res`.
    fn complete(mut self, res: i32) -> Next {
        if res == -libc::EINTR || res == -libc::EAGAIN {
            return Next::Resubmit(self);
        }
        if res < 0 {
            self.finish(Err(io::Error::from_raw_os_error(-res)));
            return Next::Done;
        }
        let n = res as usize;
        match &mut self {
            Request::Read { buf, .. } => {
                if n == 0 {
                    // End of file: return what was read.
                    self.finish(Ok(()));
                    return Next::Done;
                }
                // SAFETY: the kernel initialised `n` bytes after the filled part (n <= asked).
                unsafe { buf.set_len(buf.len() + n) };
            }
            Request::ReadDirect { buf, .. } => {
                buf.advance(n);
                // End of file, or less than whole blocks (which only happens at end of file).
                if n == 0 || !n.is_multiple_of(DIRECT_ALIGN) {
                    self.finish(Ok(()));
                    return Next::Done;
                }
            }
            Request::Write { done, .. } => {
                if n == 0 {
                    self.finish(Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0 bytes")));
                    return Next::Done;
                }
                *done += n;
            }
            Request::Fsync { .. } => {
                self.finish(Ok(()));
                return Next::Done;
            }
        }
        if self.is_complete() {
            self.finish(Ok(()));
            Next::Done
        } else {
            Next::Resubmit(self)
        }
    }

    /// The registered buffer this request holds, if any.
    fn fixed_index(&self) -> Option<u16> {
        match self {
            Request::ReadDirect { buf: DirectBuf::Fixed { index, .. }, .. } => Some(*index),
            _ => None,
        }
    }

    /// Send the result to the caller (who may have gone away: that is fine).
    fn finish(self, result: io::Result<()>) {
        match self {
            Request::Read { buf, reply, .. } => {
                let _ = reply.send(result.map(|()| buf));
            }
            Request::ReadDirect { buf, start, offset, len, reply, .. } => {
                let data = match &buf {
                    DirectBuf::Unplaced => Vec::new(),
                    DirectBuf::Own(b) => b.cut(start, offset, len),
                    DirectBuf::Fixed { addr, filled, .. } => {
                        // SAFETY: the pool's buffer at `addr` is this request's until the ring
                        // thread takes its index back, after this; `0..filled` was written.
                        let data = unsafe { std::slice::from_raw_parts(*addr as *const u8, *filled) };
                        cut(data, start, offset, len)
                    }
                };
                let _ = reply.send(result.map(|()| data));
            }
            Request::Write { reply, .. } | Request::Fsync { reply, .. } => {
                let _ = reply.send(result);
            }
        }
    }
}

/// The state the ring thread owns.
struct Worker {
    ring: IoUring,
    pool: FixedPool,
    fixed_reads: Arc<AtomicU64>,
    rx: mpsc::Receiver<Request>,
    wake: Arc<EventFd>,
    /// Requests in the kernel, indexed by `user_data`.
    slots: Vec<Option<Request>>,
    free: Vec<usize>,
    /// Accepted requests waiting for a free slot.
    waiting: VecDeque<Request>,
    closing: bool,
}

impl Worker {
    fn new(
        ring: IoUring,
        pool: FixedPool,
        depth: usize,
        rx: mpsc::Receiver<Request>,
        wake: Arc<EventFd>,
        fixed_reads: Arc<AtomicU64>,
    ) -> Worker {
        Worker {
            ring,
            pool,
            fixed_reads,
            rx,
            wake,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            waiting: VecDeque::new(),
            closing: false,
        }
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn run(mut self) {
        self.arm_wake();
        loop {
            self.accept();
            self.fill();
            if self.closing && self.in_flight() == 0 && self.waiting.is_empty() {
                break;
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => {}
                    _ => {
                        tracing::error!("io_uring_enter failed: {e}; retrying");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
            }
            self.reap();
        }
    }

    /// Take every request the callers have sent so far.
    fn accept(&mut self) {
        while !self.closing {
            match self.rx.try_recv() {
                Ok(req) if req.is_complete() => req.finish(Ok(())),
                Ok(req) => self.waiting.push_back(req),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => self.closing = true,
            }
        }
    }

    /// Move waiting requests into free slots and onto the submission queue.
    fn fill(&mut self) {
        while !self.free.is_empty() {
            let Some(req) = self.waiting.pop_front() else { break };
            let Some(slot) = self.free.pop() else { break };
            self.push(slot, req);
        }
    }

    fn push(&mut self, slot: usize, mut req: Request) {
        self.place(&mut req);
        let entry = req.entry(slot);
        self.slots[slot] = Some(req);
        // SAFETY: the entry's buffer and descriptor belong to the request now parked in
        // `slots[slot]`, which stays there until its completion is reaped. The submission queue
        // has room: it is drained by every `submit_and_wait` and holds depth + 1 entries.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            // Cannot happen with the sizes above; fail the request rather than lose it.
            if let Some(req) = self.slots[slot].take() {
                let fixed = req.fixed_index();
                req.finish(Err(io::Error::other("io_uring submission queue is full")));
                self.pool.free.extend(fixed);
            }
            self.free.push(slot);
        }
    }

    /// Give an `O_DIRECT` read about to be submitted for the first time its buffer: a free
    /// registered one if it fits, else its own.
    fn place(&mut self, req: &mut Request) {
        if let Request::ReadDirect { buf: buf @ DirectBuf::Unplaced, span, .. } = req {
            let fixed = if *span <= FIXED_BUFFER_BYTES { self.pool.free.pop() } else { None };
            *buf = match fixed {
                Some(index) => {
                    self.fixed_reads.fetch_add(1, Ordering::Relaxed);
                    let addr = self.pool.bufs[index as usize].base_ptr() as usize;
                    DirectBuf::Fixed { index, addr, filled: 0 }
                }
                None => DirectBuf::Own(AlignedBuf::new(*span)),
            };
        }
    }

    fn arm_wake(&mut self) {
        let entry = opcode::PollAdd::new(types::Fd(self.wake.0.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        // SAFETY: the eventfd lives in `self.wake` for as long as the ring does.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            tracing::error!("io_uring submission queue is full; cannot arm the wake-up poll");
        }
    }

    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (user_data, res) in done {
            if user_data == WAKE {
                self.wake.drain();
                if !self.closing {
                    self.arm_wake();
                }
                continue;
            }
            let slot = user_data as usize;
            let Some(req) = self.slots.get_mut(slot).and_then(Option::take) else {
                tracing::error!("io_uring completion for an empty slot {slot}");
                continue;
            };
            let fixed = req.fixed_index();
            match req.complete(res) {
                Next::Resubmit(req) => self.push(slot, req),
                Next::Done => {
                    // `complete` has copied the bytes out: the buffer is free again.
                    self.pool.free.extend(fixed);
                    self.free.push(slot);
                }
            }
        }
    }
}
