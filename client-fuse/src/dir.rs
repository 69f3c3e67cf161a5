//! Directory handles for readdir. A directory is read from the metaserver in pages of names;
//! the handle keeps only the current page, so listing a directory of millions of entries holds
//! one page in memory. Kernel offsets are entry positions: 1 and 2 are "." and "..", entry `j`
//! (0-based, in name order) has offset `j + 3`.

use cairn_common::Result;
use cairn_proto as p;
use tokio::sync::Mutex;

use crate::meta::MetaApi;

pub const PAGE: u32 = 1024;

pub struct DirHandle {
    pub ino: u64,
    /// Who opened it: its pages are read as this caller.
    caller: p::Caller,
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
    pub fn new(ino: u64, caller: p::Caller) -> DirHandle {
        DirHandle { ino, caller, page: Mutex::new(Page::default()) }
    }

    /// Hand the entries from position `pos` on to `add`, each with its position, until `add`
    /// says the reply is full (returns true) or the directory ends. Pages are fetched as
    /// needed; nothing is copied (a kernel reply holds far fewer entries than a page).
    pub async fn fill(
        &self,
        meta: &dyn MetaApi,
        mut pos: u64,
        mut add: impl FnMut(u64, &p::DirEntry) -> bool,
    ) -> Result<()> {
        let mut page = self.page.lock().await;
        if !page.loaded || pos < page.base {
            *page = self.fetch(meta, Vec::new(), 0).await?;
        }
        loop {
            while pos >= page.base + page.entries.len() as u64 && page.more {
                let after = page.entries.last().map(|e| e.name.clone()).unwrap_or_default();
                let base = page.base + page.entries.len() as u64;
                *page = self.fetch(meta, after, base).await?;
            }
            let skip = (pos - page.base) as usize;
            let Some(rest) = page.entries.get(skip..).filter(|r| !r.is_empty()) else {
                return Ok(()); // the end of the directory
            };
            for e in rest {
                if add(pos, e) {
                    return Ok(());
                }
                pos += 1;
            }
        }
    }

    async fn fetch(&self, meta: &dyn MetaApi, after: Vec<u8>, base: u64) -> Result<Page> {
        let req = p::ReadDirRequest {
            ino: self.ino,
            after,
            limit: PAGE,
            plus: false,
            caller: Some(self.caller.clone()),
        };
        let reply = meta.read_dir(req).await?;
        Ok(Page { base, entries: reply.entries, more: reply.more, loaded: true })
    }
}
