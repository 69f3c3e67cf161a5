//! The ceiling of each FUSE transport on this machine (issue 19, item 4): a minimal in-memory
//! filesystem answered over the classic `/dev/fuse` loop (one `read` and one `write` per request,
//! several threads on cloned descriptors, as `fuser` serves Cairn's mount) and over FUSE-over-
//! io_uring (kernel 6.14+, `CONFIG_FUSE_IO_URING`, module parameter `enable_uring`: one ring per
//! possible CPU, requests arrive as completions of registered entries and each reply is committed
//! together with the fetch of the next request). Both transports call the same handler, so the
//! difference measured is the transport alone.
//!
//! Load, from threads of this process, each in a directory of its own:
//! - `null`: `fgetxattr` of a name the filesystem answers `ENODATA` for: one request per call,
//!   nothing cached by the kernel, the cheapest round trip there is;
//! - `create`: `open(O_CREAT|O_EXCL)` + `close` of a new file: LOOKUP, CREATE, FLUSH, RELEASE.
//!
//! Prints one line per run: operations per second, CPU time of the whole machine per operation,
//! context switches per operation, and how many requests each transport carried, so that a ring
//! run that fell back to `/dev/fuse` cannot pass for a ring run. Needs root (it mounts). This is a
//! measuring tool: the client does not use this code. Run:
//! `cargo run --release -p cairn-bench --bin fuse-transport -- --transport uring --op null`
//! (`bench/fuse_transport.sh` alternates both transports over rounds and prints a table).

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

const ROOT: u64 = 1;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
const MAX_WRITE: usize = 128 << 10;
/// One `/dev/fuse` read must fit the largest request: a header and `MAX_WRITE` bytes of data.
const DEV_BUFFER: usize = MAX_WRITE + 4096;

// Opcodes (include/uapi/linux/fuse.h).
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const MKDIR: u32 = 9;
const UNLINK: u32 = 10;
const OPEN: u32 = 14;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const GETXATTR: u32 = 22;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const CREATE: u32 = 35;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;

// INIT flags.
const ASYNC_READ: u64 = 1 << 0;
const PARALLEL_DIROPS: u64 = 1 << 18;
const INIT_EXT: u64 = 1 << 30;
const OVER_IO_URING: u64 = 1 << 41;

// FUSE-over-io_uring: the commands and the layout of an entry's header buffer
// (`struct fuse_uring_req_header`: the in/out header, the operation's own header, then
// `struct fuse_uring_ent_in_out`).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
const RING_HEADER: usize = 288;
const RING_ENT_COMMIT_ID: usize = 264;
const RING_ENT_PAYLOAD_SZ: usize = 272;
/// The payload buffer of an entry must hold the largest request (`max_write`, and the kernel's
/// default of 32 pages).
const RING_PAYLOAD: usize = MAX_WRITE;

/// `_IOR(229, 0, uint32_t)`: a new `/dev/fuse` descriptor served as another channel of a mount.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// `struct fuse_in_header`, the fields this filesystem reads.
struct InHeader {
    opcode: u32,
    unique: u64,
    nodeid: u64,
}

impl InHeader {
    fn parse(b: &[u8]) -> InHeader {
        InHeader { opcode: u32_at(b, 4), unique: u64_at(b, 8), nodeid: u64_at(b, 16) }
    }
}

/// Size of the operation's own header in a `/dev/fuse` request (what the ring puts apart in
/// `op_in`); names and data follow it.
fn op_header_size(opcode: u32) -> usize {
    match opcode {
        GETATTR | CREATE | FSYNC => 16,
        MKDIR | OPEN | OPENDIR | GETXATTR | FORGET | INTERRUPT => 8,
        FLUSH | RELEASE | RELEASEDIR => 24,
        READDIR => 40,
        SETATTR => 88,
        _ => 0,
    }
}

/// What the handler answers: bytes written after the out header, an errno, or nothing at all
/// (FORGET and INTERRUPT are not answered).
enum Reply {
    Data(usize),
    Errno(i32),
    Nothing,
}

/// The filesystem: directories and empty files in memory, names per parent.
#[derive(Default)]
struct NullFs {
    names: Mutex<HashMap<(u64, Vec<u8>), u64>>,
    dirs: Mutex<std::collections::HashSet<u64>>,
    next_ino: AtomicU64,
    via_dev: AtomicU64,
    via_ring: AtomicU64,
}

/// `struct fuse_attr` (88 bytes) at `out[at..]`.
fn put_attr(out: &mut [u8], at: usize, ino: u64, dir: bool) {
    out[at..at + 88].fill(0);
    put_u64(out, at, ino);
    let mode = if dir { libc::S_IFDIR | 0o755 } else { libc::S_IFREG | 0o644 };
    put_u32(out, at + 60, mode);
    put_u32(out, at + 64, if dir { 2 } else { 1 });
    put_u32(out, at + 80, 4096);
}

/// `struct fuse_entry_out` (128 bytes): names cached an hour, attributes not at all.
fn put_entry(out: &mut [u8], ino: u64, dir: bool) -> usize {
    out[..40].fill(0);
    put_u64(out, 0, ino);
    put_u64(out, 16, 3600);
    put_attr(out, 40, ino, dir);
    128
}

fn name_of(rest: &[u8]) -> &[u8] {
    rest.split(|&b| b == 0).next().unwrap_or_default()
}

impl NullFs {
    fn new() -> NullFs {
        let fs = NullFs { next_ino: AtomicU64::new(ROOT + 1), ..NullFs::default() };
        fs.dirs.lock().expect("dirs").insert(ROOT);
        fs
    }

    fn is_dir(&self, ino: u64) -> bool {
        self.dirs.lock().expect("dirs").contains(&ino)
    }

    fn make(&self, parent: u64, name: &[u8], dir: bool) -> Result<u64, i32> {
        let mut names = self.names.lock().expect("names");
        let key = (parent, name.to_vec());
        if names.contains_key(&key) {
            return Err(libc::EEXIST);
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        names.insert(key, ino);
        if dir {
            self.dirs.lock().expect("dirs").insert(ino);
        }
        Ok(ino)
    }

    /// One request: `rest` is what follows the operation's own header (names; no operation
    /// here reads its header), the answer goes to `out` (after the out header).
    fn handle(&self, h: &InHeader, rest: &[u8], out: &mut [u8]) -> Reply {
        match h.opcode {
            LOOKUP => {
                let found =
                    self.names.lock().expect("names").get(&(h.nodeid, name_of(rest).to_vec())).copied();
                match found {
                    Some(ino) => Reply::Data(put_entry(out, ino, self.is_dir(ino))),
                    None => Reply::Errno(libc::ENOENT),
                }
            }
            GETATTR | SETATTR => {
                out[..16].fill(0);
                put_attr(out, 16, h.nodeid, self.is_dir(h.nodeid));
                Reply::Data(104)
            }
            MKDIR => match self.make(h.nodeid, name_of(rest), true) {
                Ok(ino) => Reply::Data(put_entry(out, ino, true)),
                Err(e) => Reply::Errno(e),
            },
            CREATE => match self.make(h.nodeid, name_of(rest), false) {
                Ok(ino) => {
                    let n = put_entry(out, ino, false);
                    out[n..n + 16].fill(0);
                    Reply::Data(n + 16)
                }
                Err(e) => Reply::Errno(e),
            },
            UNLINK => match self.names.lock().expect("names").remove(&(h.nodeid, name_of(rest).to_vec())) {
                Some(_) => Reply::Data(0),
                None => Reply::Errno(libc::ENOENT),
            },
            OPEN | OPENDIR => {
                out[..16].fill(0);
                Reply::Data(16)
            }
            STATFS => {
                out[..80].fill(0);
                put_u32(out, 40, 4096);
                put_u32(out, 44, 255);
                Reply::Data(80)
            }
            GETXATTR => Reply::Errno(libc::ENODATA),
            FLUSH | RELEASE | RELEASEDIR | FSYNC | READDIR | DESTROY => Reply::Data(0),
            FORGET | BATCH_FORGET | INTERRUPT => Reply::Nothing,
            _ => Reply::Errno(libc::ENOSYS),
        }
    }
}

/// `struct fuse_out_header`: the length of the whole answer, the negated errno, the request.
fn put_out_header(out: &mut [u8], unique: u64, reply: &Reply) {
    let (data, error) = match *reply {
        Reply::Data(n) => (n, 0),
        Reply::Errno(e) => (0, -e),
        Reply::Nothing => (0, 0),
    };
    put_u32(out, 0, (OUT_HEADER + data) as u32);
    put_u32(out, 4, error as u32);
    put_u64(out, 8, unique);
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Answers INIT: the kernel's offer, less what this filesystem does not want.
fn init_reply(body: &[u8], ring: bool, out: &mut [u8]) -> usize {
    let (major, minor, readahead) = (u32_at(body, 0), u32_at(body, 4), u32_at(body, 8));
    let mut offered = u64::from(u32_at(body, 12));
    if offered & INIT_EXT != 0 {
        offered |= u64::from(u32_at(body, 16)) << 32;
    }
    let wanted = ASYNC_READ | PARALLEL_DIROPS | INIT_EXT | if ring { OVER_IO_URING } else { 0 };
    let flags = offered & wanted;
    out[..64].fill(0);
    put_u32(out, 0, major.min(7));
    put_u32(out, 4, minor);
    put_u32(out, 8, readahead);
    put_u32(out, 12, flags as u32);
    out[16..18].copy_from_slice(&16u16.to_le_bytes());
    out[18..20].copy_from_slice(&12u16.to_le_bytes());
    put_u32(out, 20, MAX_WRITE as u32);
    put_u32(out, 24, 1);
    put_u32(out, 32, (flags >> 32) as u32);
    64
}

/// The `/dev/fuse` loop: read a request, answer it, until the mount goes. The first thread
/// answers INIT and says so on `inited` (with whether the kernel accepted the ring).
fn serve_dev(fs: &NullFs, fd: RawFd, ring: bool, inited: Option<mpsc::Sender<bool>>) {
    let mut buf = vec![0u8; DEV_BUFFER];
    let mut out = vec![0u8; DEV_BUFFER];
    loop {
        // SAFETY: `buf` is a live buffer of `buf.len()` bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match errno() {
                libc::EINTR | libc::EAGAIN | libc::ENOENT => continue,
                _ => return,
            }
        }
        let n = n as usize;
        if n < IN_HEADER {
            continue;
        }
        let h = InHeader::parse(&buf[..IN_HEADER]);
        let body = &buf[IN_HEADER..n];
        let reply = if h.opcode == INIT {
            let len = init_reply(body, ring, &mut out[OUT_HEADER..]);
            let accepted = u32_at(&out[OUT_HEADER..], 32) & (OVER_IO_URING >> 32) as u32 != 0;
            let reply = Reply::Data(len);
            put_out_header(&mut out, h.unique, &reply);
            // SAFETY: `out` holds the header and `len` bytes.
            unsafe { libc::write(fd, out.as_ptr().cast(), OUT_HEADER + len) };
            if let Some(tx) = &inited {
                let _ = tx.send(accepted);
            }
            continue;
        } else {
            let split = op_header_size(h.opcode).min(body.len());
            fs.handle(&h, &body[split..], &mut out[OUT_HEADER..])
        };
        if matches!(reply, Reply::Nothing) {
            continue;
        }
        fs.via_dev.fetch_add(1, Ordering::Relaxed);
        put_out_header(&mut out, h.unique, &reply);
        let len = u32_at(&out, 0) as usize;
        // SAFETY: `out` holds `len` bytes.
        unsafe { libc::write(fd, out.as_ptr().cast(), len) };
    }
}

/// One ring entry: the header and payload buffers the kernel was given at REGISTER, and the
/// iovec pair naming them (its address is what the REGISTER command carries).
struct RingEntry {
    header: Vec<u8>,
    payload: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

/// An `IORING_OP_URING_CMD` for queue `qid` (`struct fuse_uring_cmd_req` in the command area).
fn ring_command(
    fd: RawFd,
    cmd: u32,
    qid: u16,
    commit_id: u64,
    iov: &[libc::iovec; 2],
    entry: usize,
) -> squeue::Entry128 {
    let mut area = [0u8; 80];
    put_u64(&mut area, 8, commit_id);
    area[16..18].copy_from_slice(&qid.to_le_bytes());
    let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd)
        .cmd(area)
        .addr(Some(iov.as_ptr() as u64))
        .build()
        .user_data(entry as u64);
    // The crate has no setter for the SQE's `len`, which REGISTER must set to the number of
    // iovecs (2). `Entry128` is `repr(C)`: the 64-byte SQE, then the 64 bytes of command area.
    // SAFETY: same size and plain bytes both ways; `len` is the u32 at offset 24 of the SQE.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    put_u32(&mut bytes, 24, 2);
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// One queue of the ring transport, on its own thread pinned to CPU `qid` (the kernel sends a
/// request to the queue of the CPU its caller runs on). Registers `depth` entries, then answers
/// each request that completes one and fetches the next in the same command.
fn serve_ring(fs: &NullFs, fd: RawFd, qid: u16, depth: usize, registered: &AtomicU64) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity read only it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(qid as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().setup_single_issuer().setup_defer_taskrun().build(2 * depth as u32)?;
    let mut entries: Vec<RingEntry> = (0..depth)
        .map(|_| {
            let mut header = vec![0u8; RING_HEADER];
            let mut payload = vec![0u8; RING_PAYLOAD];
            let iov = Box::new([
                libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: header.len() },
                libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
            ]);
            RingEntry { header, payload, iov }
        })
        .collect();
    for (i, e) in entries.iter().enumerate() {
        let sqe = ring_command(fd, CMD_REGISTER, qid, 0, &e.iov, i);
        // SAFETY: the entry's buffers and iovecs live until this function returns, after the
        // ring (and so every command naming them) is gone.
        unsafe { ring.submission().push(&sqe) }.map_err(|_| io::Error::other("submission queue full"))?;
    }
    ring.submit()?;
    registered.fetch_add(depth as u64, Ordering::Relaxed);
    let mut out = vec![0u8; RING_PAYLOAD];
    let mut done = Vec::with_capacity(depth);
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data() as usize, c.result())));
        for &(i, res) in &done {
            if res < 0 {
                return match -res {
                    libc::ENOTCONN | libc::ENODEV | libc::ECANCELED | libc::ECONNABORTED => Ok(()),
                    e => Err(io::Error::from_raw_os_error(e)),
                };
            }
            let e = &mut entries[i];
            let h = InHeader::parse(&e.header[..IN_HEADER]);
            let commit_id = u64_at(&e.header, RING_ENT_COMMIT_ID);
            let size = (u32_at(&e.header, RING_ENT_PAYLOAD_SZ) as usize).min(RING_PAYLOAD);
            // The operation's own header is in `e.header[128..256]`; names are in the payload.
            let reply = fs.handle(&h, &e.payload[..size], &mut out);
            fs.via_ring.fetch_add(1, Ordering::Relaxed);
            let n = match reply {
                Reply::Data(n) => n,
                _ => 0,
            };
            e.payload[..n].copy_from_slice(&out[..n]);
            put_out_header(&mut e.header, h.unique, &reply);
            put_u32(&mut e.header, RING_ENT_PAYLOAD_SZ, n as u32);
            let sqe = ring_command(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, &e.iov, i);
            // SAFETY: as at REGISTER.
            unsafe { ring.submission().push(&sqe) }.map_err(|_| io::Error::other("submission queue full"))?;
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Dev,
    Ring,
}

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Null,
    Create,
}

struct Args {
    transport: Transport,
    load: Load,
    threads: usize,
    depth: usize,
    procs: usize,
    secs: f64,
    /// Load an existing mount (e.g. Cairn's) instead of serving one.
    dir: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        transport: Transport::Dev,
        load: Load::Null,
        threads: 4,
        depth: 8,
        procs: 2,
        secs: 5.0,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<usize>().map_err(|_| format!("{flag}: not a number: {value}"));
        match flag.as_str() {
            "--transport" => {
                a.transport = match value.as_str() {
                    "dev" => Transport::Dev,
                    "uring" => Transport::Ring,
                    _ => return Err(format!("--transport dev|uring, not {value}")),
                }
            }
            "--op" => {
                a.load = match value.as_str() {
                    "null" => Load::Null,
                    "create" => Load::Create,
                    _ => return Err(format!("--op null|create, not {value}")),
                }
            }
            "--threads" => a.threads = number()?.max(1),
            "--depth" => a.depth = number()?.max(1),
            "--procs" => a.procs = number()?.max(1),
            "--dir" => a.dir = Some(PathBuf::from(value)),
            "--secs" => a.secs = value.parse().map_err(|_| format!("--secs: not a number: {value}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// Busy and total jiffies of the whole machine (`/proc/stat`'s first line).
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Context switches of this process's threads (voluntary and not).
fn context_switches() -> u64 {
    // SAFETY: getrusage fills the zeroed struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    (usage.ru_nvcsw + usage.ru_nivcsw) as u64
}

/// One load thread: operations until `stop`. Context switches are counted for the whole
/// process, so on a served mount they include the servers'.
fn load(dir: &Path, kind: Load, stop: &AtomicBool) -> io::Result<u64> {
    std::fs::create_dir(dir)?;
    let mut n = 0u64;
    match kind {
        Load::Null => {
            let file = std::fs::File::create(dir.join("file"))?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            let name = c"user.cairn";
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: a NUL-terminated name; a null buffer of size 0 asks for the size only.
                let r = unsafe { libc::fgetxattr(fd, name.as_ptr(), std::ptr::null_mut(), 0) };
                if r >= 0 || errno() != libc::ENODATA {
                    return Err(io::Error::other(format!("fgetxattr answered {r}, errno {}", errno())));
                }
                n += 1;
            }
        }
        Load::Create => {
            while !stop.load(Ordering::Relaxed) {
                let path = CString::new(dir.join(format!("f{n}")).into_os_string().into_encoded_bytes())
                    .map_err(io::Error::other)?;
                // SAFETY: a NUL-terminated path.
                let fd = unsafe {
                    libc::open(
                        path.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    )
                };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: `fd` was just opened here.
                unsafe { libc::close(fd) };
                n += 1;
            }
        }
    }
    Ok(n)
}

/// The kernel makes one queue per possible CPU (`/sys/devices/system/cpu/possible`, e.g. `0-1`).
fn possible_cpus() -> io::Result<u16> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = text.trim().rsplit([',', '-']).next().unwrap_or("0");
    last.parse::<u16>().map(|n| n + 1).map_err(|_| io::Error::other(format!("possible CPUs: {text}")))
}

fn mount(mountpoint: &Path, fd: RawFd) -> io::Result<()> {
    let target = CString::new(mountpoint.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let data =
        CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,max_read={MAX_WRITE}"))
            .map_err(io::Error::other)?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            c"cairn-null".as_ptr(),
            target.as_ptr(),
            c"fuse.cairn-null".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn open_dev_fuse() -> io::Result<RawFd> {
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Another channel of the mount served by `fd` (`FUSE_DEV_IOC_CLONE`).
fn clone_channel(fd: RawFd) -> io::Result<RawFd> {
    let clone = open_dev_fuse()?;
    let mut source = fd as u32;
    // SAFETY: the ioctl reads one u32.
    if unsafe { libc::ioctl(clone, FUSE_DEV_IOC_CLONE, &mut source) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(clone)
}

/// A mount of the null filesystem served over one transport.
struct Served {
    mountpoint: PathBuf,
    fs: Arc<NullFs>,
    failed: Arc<Mutex<Option<String>>>,
    servers: String,
}

fn serve(a: &Args) -> io::Result<Served> {
    let mountpoint = PathBuf::from(format!("/tmp/cairn-fuse-transport-{}", std::process::id()));
    std::fs::create_dir_all(&mountpoint)?;
    let fs = Arc::new(NullFs::new());
    let fd = open_dev_fuse()?;
    mount(&mountpoint, fd)?;
    let ring = a.transport == Transport::Ring;
    let (tx, rx) = mpsc::channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || serve_dev(&fs, fd, ring, Some(tx)));
    }
    let accepted =
        rx.recv_timeout(Duration::from_secs(10)).map_err(|_| io::Error::other("no INIT from the kernel"))?;
    let failed = Arc::new(Mutex::new(None));
    let servers = if ring {
        if !accepted {
            return Err(io::Error::other(
                "the kernel did not offer FUSE_OVER_IO_URING (echo Y > /sys/module/fuse/parameters/enable_uring)",
            ));
        }
        let cpus = possible_cpus()?;
        let registered = Arc::new(AtomicU64::new(0));
        for qid in 0..cpus {
            let (fs, registered, failed, depth) = (fs.clone(), registered.clone(), failed.clone(), a.depth);
            std::thread::spawn(move || {
                if let Err(e) = serve_ring(&fs, fd, qid, depth, &registered) {
                    *failed.lock().expect("failed") = Some(format!("queue {qid}: {e}"));
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while registered.load(Ordering::Relaxed) < u64::from(cpus) * a.depth as u64 {
            if let Some(e) = failed.lock().expect("failed").clone() {
                return Err(io::Error::other(e));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("ring queues did not register"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        format!("{cpus}x{}", a.depth)
    } else {
        for _ in 1..a.threads {
            let channel = clone_channel(fd)?;
            let fs = fs.clone();
            std::thread::spawn(move || serve_dev(&fs, channel, false, None));
        }
        a.threads.to_string()
    };
    // The kernel turns the ring on once every queue has an entry registered: give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    Ok(Served { mountpoint, fs, failed, servers })
}

impl Served {
    fn requests(&self) -> (u64, u64) {
        (self.fs.via_dev.load(Ordering::Relaxed), self.fs.via_ring.load(Ordering::Relaxed))
    }

    /// A lazy unmount ends the connection, and with it every server thread.
    fn unmount(&self) -> io::Result<()> {
        let target =
            CString::new(self.mountpoint.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.mountpoint);
        match self.failed.lock().expect("failed").clone() {
            Some(e) => Err(io::Error::other(e)),
            None => Ok(()),
        }
    }
}

/// `procs` load threads for `secs` seconds in directories of their own under `dir`.
fn measure(dir: &Path, a: &Args) -> io::Result<String> {
    let run = format!("run{}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let (busy0, total0) = cpu_jiffies();
    let switches0 = context_switches();
    let started = Instant::now();
    let workers: Vec<_> = (0..a.procs)
        .map(|t| {
            let (dir, stop, kind) = (dir.join(format!("{run}-{t}")), stop.clone(), a.load);
            std::thread::spawn(move || load(&dir, kind, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(a.secs));
    stop.store(true, Ordering::Relaxed);
    let mut ops = 0;
    for w in workers {
        ops += w.join().map_err(|_| io::Error::other("load thread panicked"))??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (busy1, total1) = cpu_jiffies();
    let switches = context_switches() - switches0;
    // SAFETY: plain query.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64;
    let busy_share = (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64;
    let ops = ops.max(1);
    Ok(format!(
        "op={} procs={} ops={ops} ops_per_s={:.0} cpu_us_per_op={:.2} switches_per_op={:.2}",
        if a.load == Load::Null { "null" } else { "create" },
        a.procs,
        ops as f64 / elapsed,
        busy_share * cpus * elapsed * 1e6 / ops as f64,
        switches as f64 / ops as f64,
    ))
}

fn run(a: &Args) -> io::Result<String> {
    if let Some(dir) = &a.dir {
        return Ok(format!("transport=mount:{} {}", dir.display(), measure(dir, a)?));
    }
    let served = serve(a)?;
    let (dev0, ring0) = served.requests();
    let measured = measure(&served.mountpoint, a);
    let (dev, ring) = served.requests();
    served.unmount()?;
    Ok(format!(
        "transport={} servers={} {} requests_dev={} requests_ring={}",
        if a.transport == Transport::Ring { "uring" } else { "dev" },
        served.servers,
        measured?,
        dev - dev0,
        ring - ring0
    ))
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "fuse-transport: {e}\nusage: fuse-transport [--transport dev|uring] [--op null|create] \
                 [--procs N] [--secs S] [--threads N (dev)] [--depth N (uring entries per queue)] \
                 [--dir DIR (load an existing mount instead)]"
            );
            std::process::exit(2);
        }
    };
    match run(&args) {
        Ok(line) => {
            println!("{line}");
            // The servers end with the connection; nothing left to wait for.
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("fuse-transport: {e}");
            std::process::exit(1);
        }
    }
}
