//! The fallback engine: `pread`/`pwrite`/`fsync` system calls on tokio's blocking thread pool.
//! Every operation is one blocking task; a short read is retried until `len` bytes or end of
//! file, and `write_all_at` handles short writes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

use super::{aligned_span, AlignedBuf, IoEngine, IoFuture, DIRECT_ALIGN};

/// Positional I/O through `spawn_blocking`.
#[derive(Debug, Default)]
pub struct PreadEngine;

impl PreadEngine {
    pub fn new() -> PreadEngine {
        PreadEngine
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("blocking I/O task failed: {e}")))?
}

fn read_full_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// An `O_DIRECT` read: the aligned span around the range into an aligned buffer. A read that
/// returns less than whole blocks has reached end of file.
fn read_direct_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let (start, span) = aligned_span(offset, len);
    let mut buf = AlignedBuf::new(span);
    while buf.spare() > 0 {
        let at = start + buf.filled() as u64;
        match file.read_at(buf.spare_mut(), at) {
            Ok(0) => break,
            Ok(n) => {
                buf.advance(n);
                if !n.is_multiple_of(DIRECT_ALIGN) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(buf.cut(start, offset, len))
}

impl IoEngine for PreadEngine {
    fn name(&self) -> &'static str {
        "pread"
    }

    fn read_at(&self, file: Arc<File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        Box::pin(blocking(move || read_full_at(&file, offset, len)))
    }

    fn read_at_direct(&self, file: Arc<File>, offset: u64, len: usize) -> IoFuture<Vec<u8>> {
        Box::pin(blocking(move || read_direct_at(&file, offset, len)))
    }

    fn write_at(&self, file: Arc<File>, offset: u64, data: Bytes) -> IoFuture<()> {
        Box::pin(blocking(move || file.write_all_at(&data, offset)))
    }

    fn fsync(&self, file: Arc<File>) -> IoFuture<()> {
        Box::pin(blocking(move || file.sync_all()))
    }
}
