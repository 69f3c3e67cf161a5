//! Directory handles for readdir. A directory is read from the metaserver in pages of names;
//! the handle keeps only the current page, so listing a directory of millions of entries holds
//! one page in memory. Kernel offsets are entry positions: 1 and 2 are "." and "..", entry `j`
//! (0-based, in name order) has offset `j + 3`.

use cairn_common::Result;
use cairn_proto as p;
use tokio::sync::Mutex;

use crate::meta::MetaConn;

pub const PAGE: u32 = 512;

pub struct DirHandle {
    pub ino: u64,
    page: Mutex<Page>,
}

#[derive(Default)]
struct Page {
    /// Position of `entries[0]` in the directory.
    base: u64,
    entries: Vec<p::DirEntry>,
    more: bool,
    loaded: bool,
}

impl DirHandle {
    pub fn new(ino: u64) -> DirHandle {
        DirHandle { ino, page: Mutex::new(Page::default()) }
    }

    /// Entries from position `pos` on (at most one page), each with its position.
    pub async fn entries_from(&self, meta: &MetaConn, pos: u64) -> Result<Vec<(u64, p::DirEntry)>> {
        let mut page = self.page.lock().await;
        if !page.loaded || pos < page.base {
            *page = self.fetch(meta, Vec::new(), 0).await?;
        }
        while pos >= page.base + page.entries.len() as u64 && page.more {
            let after = page.entries.last().map(|e| e.name.clone()).unwrap_or_default();
            let base = page.base + page.entries.len() as u64;
            *page = self.fetch(meta, after, base).await?;
        }
        let skip = (pos - page.base).min(page.entries.len() as u64) as usize;
        Ok(page.entries[skip..].iter().enumerate().map(|(i, e)| (pos + i as u64, e.clone())).collect())
    }

    async fn fetch(&self, meta: &MetaConn, after: Vec<u8>, base: u64) -> Result<Page> {
        let reply =
            meta.read_dir(p::ReadDirRequest { ino: self.ino, after, limit: PAGE, plus: false }).await?;
        Ok(Page { base, entries: reply.entries, more: reply.more, loaded: true })
    }
}
