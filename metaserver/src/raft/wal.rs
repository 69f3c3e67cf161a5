//! The Raft log's segment files (`{raft dir}/wal/`, `docs/ARCHITECTURE.md`, "On disk"): records
//! appended into space reserved when the segment was made, so a sync of an append changes no
//! file size and allocates no blocks (either would make it write the file's metadata too: on a
//! journalled file system, a journal commit). This module knows records (a kind and a body)
//! and segments; what the records mean is [`super::log`]'s.
//!
//! A record is `len` (u32 LE, the body's length), `crc` (u32 LE, CRC-32C over `len`, `kind`
//! and the body), `kind` (u8, never 0), then the body. Reserved space reads as zeros, so a kind
//! of 0 ends a segment's records.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_common::{CairnError, Result};

/// What a segment reserves when it is made (more for a record that does not fit).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// `len`, `crc`, `kind`.
pub const HEADER: u64 = 9;
/// A `len` above this is damage, not a record.
const MAX_BODY: u64 = 1 << 31;

/// Where a record's body is. Holds its segment open, so a reader can finish with a segment
/// that a purge deleted meanwhile.
#[derive(Clone, Debug)]
pub struct Loc {
    pub seg: u64,
    pub file: Arc<File>,
    pub offset: u64,
    pub len: u32,
}

impl Loc {
    /// The record's body, read back.
    pub fn read(&self) -> io::Result<Vec<u8>> {
        let mut body = vec![0; self.len as usize];
        self.file.read_exact_at(&mut body, self.offset)?;
        Ok(body)
    }
}

/// A record to append: its kind and body.
pub type Record<'a> = (u8, &'a [u8]);

/// `records` as [`Record`]s borrowing their bodies.
pub fn borrowed(records: &[(u8, Vec<u8>)]) -> Vec<Record<'_>> {
    records.iter().map(|(kind, body)| (*kind, body.as_slice())).collect()
}

fn crc(len: u32, kind: u8, body: &[u8]) -> u32 {
    let mut c = crc32c::crc32c(&len.to_le_bytes());
    c = crc32c::crc32c_append(c, &[kind]);
    crc32c::crc32c_append(c, body)
}

fn encode(out: &mut Vec<u8>, kind: u8, body: &[u8]) {
    assert_ne!(kind, 0, "kind 0 marks the end of a segment");
    let len = u32::try_from(body.len()).expect("a Raft log record under 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc(len, kind, body).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

fn segment_name(seq: u64) -> String {
    format!("{seq:016x}.seg")
}

fn io_err(what: &str, path: &Path, e: &io::Error) -> CairnError {
    CairnError::from_io(&format!("{what} {}", path.display()), e)
}

/// The segments of one log directory and the one being written.
pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    /// Every segment kept, oldest first.
    segments: BTreeMap<u64, Arc<File>>,
    /// The segment written: its number, where its next record goes, what it reserved.
    current: u64,
    end: u64,
    size: u64,
    /// Set by a failed write or sync: what is on disk is unknown, so nothing more is written
    /// (a sync that failed once may report success the next time without the data).
    broken: bool,
}

/// What a record found in [`Wal::open`]'s replay is: its kind, body and place.
pub struct Replayed<'a> {
    pub kind: u8,
    pub body: &'a [u8],
    pub loc: Loc,
}

impl Wal {
    /// Open the log in `dir` (made if absent), handing every record, oldest first, to `replay`.
    /// A record cut by a crash ends the last segment, whose rest is then zeroed and synced;
    /// a damaged record in an earlier segment is an error naming the file and offset.
    pub fn open(
        dir: &Path,
        segment_bytes: u64,
        mut replay: impl FnMut(Replayed<'_>) -> Result<()>,
    ) -> Result<Wal> {
        std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create the Raft log directory", dir, &e))?;
        let mut seqs = Vec::new();
        for item in std::fs::read_dir(dir).map_err(|e| io_err("cannot list", dir, &e))? {
            let item = item.map_err(|e| io_err("cannot list", dir, &e))?;
            let name = item.file_name();
            let name = name.to_string_lossy();
            if let Some(hex) = name.strip_suffix(".seg") {
                let seq = u64::from_str_radix(hex, 16).map_err(|_| {
                    CairnError::corrupt(format!("{}: not a Raft log segment's name", item.path().display()))
                })?;
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            segment_bytes,
            segments: BTreeMap::new(),
            current: 0,
            end: 0,
            size: 0,
            broken: false,
        };
        let last = seqs.last().copied();
        for seq in seqs {
            let path = dir.join(segment_name(seq));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io_err("cannot open the Raft log segment", &path, &e))?;
            let file = Arc::new(file);
            let size = file.metadata().map_err(|e| io_err("cannot stat", &path, &e))?.len();
            let (end, damage) = scan(seq, &file, size, &mut replay)
                .map_err(|e| io_err("cannot read the Raft log segment", &path, &e))??;
            if Some(seq) == last {
                // Whatever lies past the last record — a cut write's remains, or later records
                // of a batch whose first one was lost — must never read as records once new
                // ones are written in front of them.
                if let Some(why) = &damage {
                    tracing::warn!(
                        "Raft log segment {}: {why} at offset {end}: a write cut by a crash \
                         (never acknowledged); the log ends there",
                        path.display()
                    );
                }
                zero_from(&file, end, size).map_err(|e| io_err("cannot clear the tail of", &path, &e))?;
                let reserved = size.max(segment_bytes);
                if reserved > size {
                    reserve(&file, reserved).map_err(|e| io_err("cannot reserve space in", &path, &e))?;
                }
                file.sync_all().map_err(|e| io_err("cannot sync", &path, &e))?;
                (wal.current, wal.end, wal.size) = (seq, end, reserved);
            } else if let Some(why) = damage {
                return Err(CairnError::corrupt(format!(
                    "Raft log segment {} is damaged at offset {end} ({why}), before the last \
                     segment: synced records are lost; replace this replica (cairn meta remove, \
                     then cairn meta add with an empty data directory)",
                    path.display()
                )));
            }
            wal.segments.insert(seq, file);
        }
        if wal.segments.is_empty() {
            wal.start_segment(1, 0, &[])?;
        }
        Ok(wal)
    }

    /// Append `records` to the segment being written — to a new one, which begins with
    /// `state()`'s records, if they do not fit — and, with `sync`, `fdatasync` it. Returns
    /// where each record's body is.
    pub fn append(
        &mut self,
        records: &[Record<'_>],
        sync: bool,
        state: impl FnOnce() -> Vec<(u8, Vec<u8>)>,
    ) -> Result<Vec<Loc>> {
        if self.broken {
            return Err(CairnError::io(format!(
                "the Raft log in {} failed a write or sync earlier; restart the metaserver",
                self.dir.display()
            )));
        }
        let bytes: u64 = records.iter().map(|(_, body)| HEADER + body.len() as u64).sum();
        if self.end + bytes > self.size {
            let state = state();
            self.start_segment(self.current + 1, bytes, &borrowed(&state))?;
        }
        let mut buf = Vec::with_capacity(bytes as usize);
        let mut locs = Vec::with_capacity(records.len());
        let file = self.segments[&self.current].clone();
        for (kind, body) in records {
            locs.push(Loc {
                seg: self.current,
                file: file.clone(),
                offset: self.end + buf.len() as u64 + HEADER,
                len: body.len() as u32,
            });
            encode(&mut buf, *kind, body);
        }
        let path = self.dir.join(segment_name(self.current));
        let written =
            file.write_all_at(&buf, self.end).and_then(|()| if sync { file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
            self.broken = true;
            return Err(io_err("cannot write the Raft log segment", &path, &e));
        }
        self.end += bytes;
        Ok(locs)
    }

    /// `fdatasync` the segment being written (records appended without a sync of their own).
    pub fn sync(&mut self) -> Result<()> {
        let path = self.dir.join(segment_name(self.current));
        if let Err(e) = self.segments[&self.current].sync_data() {
            self.broken = true;
            return Err(io_err("cannot sync the Raft log segment", &path, &e));
        }
        Ok(())
    }

    /// Delete the segments before `seq` (never the one being written).
    pub fn remove_before(&mut self, seq: u64) -> Result<()> {
        let keep = seq.min(self.current);
        let old: Vec<u64> = self.segments.range(..keep).map(|(s, _)| *s).collect();
        self.remove(&old)
    }

    /// Delete the segments `seqs` (never the one being written).
    pub fn remove(&mut self, seqs: &[u64]) -> Result<()> {
        let old: Vec<u64> =
            seqs.iter().copied().filter(|s| *s != self.current && self.segments.contains_key(s)).collect();
        if old.is_empty() {
            return Ok(());
        }
        for seq in old {
            let path = self.dir.join(segment_name(seq));
            std::fs::remove_file(&path)
                .map_err(|e| io_err("cannot delete the Raft log segment", &path, &e))?;
            self.segments.remove(&seq);
        }
        sync_dir(&self.dir)
    }

    /// Write from now on in a new segment that begins with `state`.
    pub fn roll(&mut self, state: &[Record<'_>]) -> Result<()> {
        self.start_segment(self.current + 1, 0, state)
    }

    /// The segment being written.
    pub fn current(&self) -> u64 {
        self.current
    }

    /// The segments kept, oldest first.
    pub fn segments(&self) -> Vec<u64> {
        self.segments.keys().copied().collect()
    }

    /// Make segment `seq`, reserving room for `bytes` of records after `state`, write `state`
    /// into it, sync it and the directory, and write there from now on.
    fn start_segment(&mut self, seq: u64, bytes: u64, state: &[Record<'_>]) -> Result<()> {
        let mut buf = Vec::new();
        for (kind, body) in state {
            encode(&mut buf, *kind, body);
        }
        let size = self.segment_bytes.max(buf.len() as u64 + bytes);
        let path = self.dir.join(segment_name(seq));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err("cannot make the Raft log segment", &path, &e))?;
        let made =
            reserve(&file, size).and_then(|()| file.write_all_at(&buf, 0)).and_then(|()| file.sync_all());
        if let Err(e) = made {
            // Nothing is in it yet: gone, so a later try (once space is freed) can make it.
            let _ = std::fs::remove_file(&path);
            return Err(io_err("cannot make the Raft log segment", &path, &e));
        }
        sync_dir(&self.dir)?;
        self.segments.insert(seq, Arc::new(file));
        (self.current, self.end, self.size) = (seq, buf.len() as u64, size);
        Ok(())
    }
}

/// Read `file`'s records from its start until the end marker or damage, handing each to
/// `replay`. Returns where the records end and, if they end in damage, what it is.
fn scan(
    seq: u64,
    file: &Arc<File>,
    size: u64,
    replay: &mut impl FnMut(Replayed<'_>) -> Result<()>,
) -> io::Result<Result<(u64, Option<String>)>> {
    let mut at = 0;
    let mut body = Vec::new();
    loop {
        if at + HEADER > size {
            return Ok(Ok((at, None)));
        }
        let mut header = [0u8; HEADER as usize];
        file.read_exact_at(&mut header, at)?;
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let sum = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let kind = header[8];
        if header == [0; HEADER as usize] {
            return Ok(Ok((at, None)));
        }
        if kind == 0 || len as u64 > MAX_BODY || at + HEADER + len as u64 > size {
            return Ok(Ok((
                at,
                Some(format!("a record header that is not one (kind {kind}, length {len})")),
            )));
        }
        body.resize(len as usize, 0);
        file.read_exact_at(&mut body, at + HEADER)?;
        if crc(len, kind, &body) != sum {
            return Ok(Ok((at, Some("a record whose checksum does not match".to_string()))));
        }
        let loc = Loc { seg: seq, file: file.clone(), offset: at + HEADER, len };
        if let Err(e) = replay(Replayed { kind, body: &body, loc }) {
            return Ok(Err(e));
        }
        at += HEADER + len as u64;
    }
}

/// Reserve `size` bytes of `file` (its length becomes `size`), so writes within it allocate
/// nothing; where the file system cannot, only the length is set.
fn reserve(file: &File, size: u64) -> io::Result<()> {
    // SAFETY: fallocate on a file descriptor we own, with plain integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(size),
        _ => Err(e),
    }
}

/// Make `file` read as zeros from `from` to `size`.
fn zero_from(file: &File, from: u64, size: u64) -> io::Result<()> {
    if from >= size {
        return Ok(());
    }
    let len = (size - from) as libc::off_t;
    // SAFETY: as in `reserve`.
    let rc =
        unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_ZERO_RANGE, from as libc::off_t, len) };
    if rc == 0 {
        return Ok(());
    }
    let unsupported = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS));
    let e = io::Error::last_os_error();
    if !unsupported(&e) {
        return Err(e);
    }
    // tmpfs has no zero range but punches holes: the range reads as zeros and the file keeps
    // its size (the pages come back when written).
    // SAFETY: as in `reserve`.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            from as libc::off_t,
            len,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !unsupported(&e) {
        return Err(e);
    }
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < size {
        let n = (size - at).min(zeros.len() as u64);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err("cannot sync the directory", dir, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(dir: &Path, segment_bytes: u64) -> (Wal, Vec<(u8, Vec<u8>, u64)>) {
        let mut seen = Vec::new();
        let wal = Wal::open(dir, segment_bytes, |r| {
            seen.push((r.kind, r.body.to_vec(), r.loc.seg));
            Ok(())
        })
        .unwrap();
        (wal, seen)
    }

    fn no_state() -> Vec<(u8, Vec<u8>)> {
        Vec::new()
    }

    /// The tail zeroing at open, on ext4 (zero range) and on tmpfs (a punched hole): the range
    /// reads as zeros, what is before it is kept, the size does not change.
    #[test]
    fn zeroing_a_tail_keeps_the_head_and_the_size_on_ext4_and_tmpfs() {
        let shm = Path::new("/dev/shm");
        let mut dirs = vec![tempfile::tempdir().unwrap()];
        if shm.is_dir() {
            dirs.push(tempfile::tempdir_in(shm).unwrap());
        }
        for dir in &dirs {
            let path = dir.path().join("segment");
            let file =
                File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
            let size = 3 << 20;
            file.write_all_at(&vec![0xa5u8; size as usize], 0).unwrap();
            zero_from(&file, 5000, size).unwrap();
            let back = std::fs::read(&path).unwrap();
            assert_eq!(back.len() as u64, size, "{}", path.display());
            assert!(back[..5000].iter().all(|b| *b == 0xa5), "{}: the head was kept", path.display());
            assert!(back[5000..].iter().all(|b| *b == 0), "{}: the tail reads as zeros", path.display());
            if dir.path().starts_with(shm) {
                use std::os::unix::fs::MetadataExt;
                let held = file.metadata().unwrap().blocks() * 512;
                assert!(
                    held < size / 2,
                    "tmpfs: the tail was punched out, not written with zeros ({held} bytes held)"
                );
            }
        }
    }

    #[test]
    fn records_come_back_in_order_across_segments_and_a_new_segment_starts_with_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, seen) = records(dir.path(), 4096);
        assert!(seen.is_empty());
        let body = vec![7u8; 1000];
        for i in 0..10u8 {
            let locs =
                wal.append(&[(1, &body[..900 + i as usize])], i % 2 == 0, || vec![(2, vec![i])]).unwrap();
            assert_eq!(locs[0].read().unwrap(), body[..900 + i as usize]);
        }
        wal.sync().unwrap();
        assert!(wal.segments().len() >= 3, "4 KiB segments hold four records each: {:?}", wal.segments());
        drop(wal);
        let (_, seen) = records(dir.path(), 4096);
        let entries: Vec<usize> = seen.iter().filter(|r| r.0 == 1).map(|r| r.1.len()).collect();
        assert_eq!(entries, (900..910).collect::<Vec<_>>());
        // Each segment after the first begins with the state as it was when it was made.
        let first_of_each: Vec<(u8, Vec<u8>)> = seen
            .iter()
            .enumerate()
            .filter(|(i, r)| *i == 0 || seen[i - 1].2 != r.2)
            .map(|(_, r)| (r.0, r.1.clone()))
            .collect();
        assert_eq!(first_of_each[0].0, 1);
        assert!(first_of_each[1..].iter().all(|(kind, _)| *kind == 2), "{first_of_each:?}");
    }

    #[test]
    fn a_record_larger_than_a_segment_gets_a_segment_of_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = records(dir.path(), 4096);
        let big = vec![3u8; 10_000];
        wal.append(&[(1, &big)], true, no_state).unwrap();
        wal.append(&[(1, b"after")], true, no_state).unwrap();
        drop(wal);
        let (_, seen) = records(dir.path(), 4096);
        assert_eq!(seen.iter().map(|r| r.1.len()).collect::<Vec<_>>(), vec![10_000, 5]);
    }

    /// A batch whose first record's header was lost in a crash (its sectors never reached the
    /// disk) while a later one's did: the log ends before the batch, and the later record never
    /// comes back, even once a new record of the same size is written where the first was.
    #[test]
    fn records_past_a_cut_write_never_come_back_behind_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = records(dir.path(), 1 << 16);
        wal.append(&[(1, b"one")], true, no_state).unwrap();
        let locs = wal.append(&[(1, b"two-old"), (1, b"three-old")], true, no_state).unwrap();
        drop(wal);
        let seg = dir.path().join(segment_name(1));
        let file = OpenOptions::new().write(true).open(&seg).unwrap();
        file.write_all_at(&[0; HEADER as usize], locs[0].offset - HEADER).unwrap();
        drop(file);

        let (mut wal, seen) = records(dir.path(), 1 << 16);
        assert_eq!(seen.iter().map(|r| r.1.clone()).collect::<Vec<_>>(), vec![b"one".to_vec()]);
        wal.append(&[(1, b"two-new")], true, no_state).unwrap();
        drop(wal);
        let (_, seen) = records(dir.path(), 1 << 16);
        assert_eq!(
            seen.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
            vec![b"one".to_vec(), b"two-new".to_vec()],
            "the old third record stays gone"
        );
    }

    #[test]
    fn a_damaged_tail_ends_the_log_and_damage_before_the_last_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = records(dir.path(), 4096);
        let body = vec![5u8; 1500];
        let mut locs = Vec::new();
        for _ in 0..6 {
            locs.extend(wal.append(&[(1, &body)], true, no_state).unwrap());
        }
        drop(wal);
        let flip = |loc: &Loc| {
            let path = dir.path().join(segment_name(loc.seg));
            let file = OpenOptions::new().write(true).open(path).unwrap();
            file.write_all_at(&[0xff], loc.offset + 10).unwrap();
        };
        // The last record, cut: the log ends before it.
        flip(&locs[5]);
        let (_, seen) = records(dir.path(), 4096);
        assert_eq!(seen.len(), 5);
        // A record of the first segment damaged: refused, naming the file.
        flip(&locs[0]);
        let err = Wal::open(dir.path(), 4096, |_| Ok(())).err().expect("refused");
        assert!(err.to_string().contains(&segment_name(locs[0].seg)), "{err}");
    }

    #[test]
    fn removing_keeps_the_segment_being_written() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = records(dir.path(), 4096);
        for _ in 0..6 {
            wal.append(&[(1, &[1u8; 1500])], true, no_state).unwrap();
        }
        let before = wal.segments();
        wal.remove_before(u64::MAX).unwrap();
        assert_eq!(wal.segments(), vec![*before.last().unwrap()]);
        let names = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(names, 1);
    }
}
