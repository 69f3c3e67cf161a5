//! Pinned files: inode numbers whose shards on this chunkserver stay on the SSD tier until
//! unpinned (`cairn warmup --pin` / `--unpin`). The mover never demotes them and a warmup never
//! evicts them.
//!
//! The set lives in `{state_dir}/pins`: the line `cairn-pins 1`, then one decimal inode number
//! per line. It is replaced atomically (temp file, fsync, rename, directory fsync) before a
//! change is acknowledged, and a file that does not parse stops the chunkserver at start: an
//! operator's pins are never dropped silently. A store without a path (tests) keeps the set in
//! memory only.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use cairn_common::{CairnError, Result};
use parking_lot::Mutex;

const HEADER: &str = "cairn-pins 1";

pub struct Pins {
    path: Option<PathBuf>,
    inos: Mutex<BTreeSet<u64>>,
    /// One change at a time, so the file always holds the newest set.
    writing: tokio::sync::Mutex<()>,
}

impl Pins {
    /// The set saved at `path` (none when the file does not exist yet).
    pub fn load(path: Option<PathBuf>) -> Result<Pins> {
        let inos = match &path {
            Some(p) => match std::fs::read_to_string(p) {
                Ok(text) => parse(p, &text)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
                Err(e) => return Err(CairnError::from_io(&format!("read {}", p.display()), &e)),
            },
            None => BTreeSet::new(),
        };
        Ok(Pins { path, inos: Mutex::new(inos), writing: tokio::sync::Mutex::new(()) })
    }

    pub fn contains(&self, ino: u64) -> bool {
        self.inos.lock().contains(&ino)
    }

    /// A copy of the set (for filtering many shards under one lock).
    pub fn snapshot(&self) -> BTreeSet<u64> {
        self.inos.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.inos.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pin `inos`, saved before this returns; how many were not pinned yet.
    pub async fn add(&self, inos: impl IntoIterator<Item = u64>) -> Result<usize> {
        self.change(|set| inos.into_iter().filter(|&i| set.insert(i)).count()).await
    }

    /// Unpin `inos`, saved before this returns; how many were pinned.
    pub async fn remove(&self, inos: impl IntoIterator<Item = u64>) -> Result<usize> {
        self.change(|set| inos.into_iter().filter(|i| set.remove(i)).count()).await
    }

    async fn change(&self, f: impl FnOnce(&mut BTreeSet<u64>) -> usize) -> Result<usize> {
        let _writing = self.writing.lock().await;
        let mut next = self.inos.lock().clone();
        let changed = f(&mut next);
        if changed == 0 {
            return Ok(0);
        }
        if let Some(path) = self.path.clone() {
            let saved = next.clone();
            tokio::task::spawn_blocking(move || save(&path, &saved))
                .await
                .map_err(|e| CairnError::internal(format!("saving pins: {e}")))??;
        }
        *self.inos.lock() = next;
        Ok(changed)
    }
}

fn parse(path: &Path, text: &str) -> Result<BTreeSet<u64>> {
    let bad = |line: usize, what: &str| {
        CairnError::corrupt(format!(
            "{} line {line}: {what}; fix or remove the file (it lists the inodes `cairn warmup --pin` pinned)",
            path.display()
        ))
    };
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(bad(1, &format!("expected {HEADER:?}")));
    }
    let mut inos = BTreeSet::new();
    for (n, line) in lines.enumerate() {
        let ino = line
            .trim()
            .parse::<u64>()
            .map_err(|_| bad(n + 2, &format!("{line:?} is not an inode number")))?;
        inos.insert(ino);
    }
    Ok(inos)
}

fn save(path: &Path, inos: &BTreeSet<u64>) -> Result<()> {
    let io =
        |what: &str, p: &Path, e: std::io::Error| CairnError::from_io(&format!("{what} {}", p.display()), &e);
    let tmp = path.with_extension("tmp");
    let mut text = String::with_capacity(HEADER.len() + 1 + inos.len() * 8);
    text.push_str(HEADER);
    text.push('\n');
    for ino in inos {
        text.push_str(&ino.to_string());
        text.push('\n');
    }
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", &tmp, e))?;
    f.write_all(text.as_bytes()).map_err(|e| io("write", &tmp, e))?;
    f.sync_all().map_err(|e| io("fsync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("rename into", path, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("fsync", dir, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pins_survive_a_reload_and_a_bad_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pins");
        let pins = Pins::load(Some(path.clone())).unwrap();
        assert!(pins.is_empty());
        assert_eq!(pins.add([7, 9, 7]).await.unwrap(), 2);
        assert_eq!(pins.add([9]).await.unwrap(), 0);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "cairn-pins 1\n7\n9\n");
        let again = Pins::load(Some(path.clone())).unwrap();
        assert!(again.contains(7) && again.contains(9) && !again.contains(8));
        assert_eq!(again.remove([9, 11]).await.unwrap(), 1);
        assert_eq!(Pins::load(Some(path.clone())).unwrap().snapshot(), BTreeSet::from([7]));

        std::fs::write(&path, "cairn-pins 1\n7\nseven\n").unwrap();
        let err = Pins::load(Some(path.clone())).err().expect("a bad line is refused");
        assert!(err.message().contains("line 3") && err.message().contains("seven"), "{err}");
        std::fs::write(&path, "something else\n").unwrap();
        assert!(Pins::load(Some(path)).is_err());
        // Without a path the set is in memory only.
        let memory = Pins::load(None).unwrap();
        assert_eq!(memory.add([1]).await.unwrap(), 1);
        assert!(memory.contains(1));
    }
}
