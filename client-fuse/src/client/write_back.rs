//! Write-back of open files: a task of the client that, every fifth of the commit interval,
//! has each open file whose oldest uncommitted change is older than the interval write out
//! and commit what it can ([`OpenFile::write_back`]), so a writer that never closes, or a
//! client that dies, loses at most about 1.2 intervals of writes. It holds the client weakly
//! and ends once the client is dropped.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::Client;
use crate::file::OpenFile;
use crate::metrics;

/// Files written back at once in one pass.
const FILES_AT_ONCE: usize = 8;

impl Client {
    /// One write-back pass: every open file whose oldest uncommitted change is older than the
    /// commit interval writes out and commits what it can (see [`OpenFile::write_back`]).
    /// Publishes the age of the oldest change still uncommitted afterwards.
    async fn write_back_pass(&self) {
        use futures::StreamExt;
        let interval = self.options.commit_interval;
        let Some(due) = Instant::now().checked_sub(interval) else { return };
        let files: Vec<(u64, Arc<OpenFile>)> = self
            .files
            .lock()
            .iter()
            .filter(|(_, o)| o.file.uncommitted_since().is_some_and(|t| t <= due))
            .map(|(ino, o)| (*ino, o.file.clone()))
            .collect();
        futures::stream::iter(files)
            .for_each_concurrent(FILES_AT_ONCE, |(ino, file)| async move {
                match file.write_back(&self.nodes, &*self.meta, &self.versions, self.changes(ino), due).await
                {
                    Ok(Some(done)) => {
                        if done.attr.is_some() {
                            tracing::debug!(
                                ino,
                                stripes = done.stripes,
                                size = done.size,
                                "write-back committed"
                            );
                            ::metrics::counter!(metrics::WRITE_BACK_COMMITS).increment(1);
                            ::metrics::counter!(metrics::WRITE_BACK_BYTES).increment(done.bytes);
                        }
                        if let Some(e) = done.error {
                            ::metrics::counter!(metrics::WRITE_BACK_FAILURES).increment(1);
                            tracing::warn!(
                                ino,
                                committed = done.stripes,
                                "write-back could not store a stripe ({e}); it and what follows stay \
                                 uncommitted, tried again later"
                            );
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        ::metrics::counter!(metrics::WRITE_BACK_FAILURES).increment(1);
                        tracing::warn!(ino, "write-back commit failed ({e}); trying again later");
                    }
                }
            })
            .await;
        let now = Instant::now();
        let oldest = self
            .files
            .lock()
            .values()
            .filter_map(|o| o.file.uncommitted_since())
            .map(|since| now.saturating_duration_since(since))
            .max()
            .unwrap_or_default();
        ::metrics::gauge!(metrics::OLDEST_UNCOMMITTED).set(oldest.as_secs_f64());
    }
}

/// The write-back task: a pass every fifth of the commit interval (10 ms to 1 s), so a change
/// is committed within about 1.2 intervals of being made. Ends when the client is dropped.
pub(super) async fn run(client: Weak<Client>) {
    let Some(every) = client.upgrade().map(|c| (c.options.commit_interval / 5).clamp(MIN_PASS, MAX_PASS))
    else {
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(client) = client.upgrade() else { return };
        client.write_back_pass().await;
    }
}

const MIN_PASS: Duration = Duration::from_millis(10);
const MAX_PASS: Duration = Duration::from_secs(1);
