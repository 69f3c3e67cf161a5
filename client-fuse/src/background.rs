//! The long-running tasks a [`Client`](crate::Client) starts (session heartbeat, batched
//! releases, write-back): owned by it, stopped when it is dropped, so a client that goes away
//! stops heartbeating its session (the metaserver then expires it after its lease and releases
//! what it held) instead of keeping it alive from a task nobody can reach.

use std::future::Future;

use parking_lot::Mutex;
use tokio::task::JoinHandle;

#[derive(Default)]
pub(crate) struct Background {
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Background {
    /// Run `task` until it ends or this is dropped.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock();
        tasks.retain(|t| !t.is_finished());
        tasks.push(tokio::spawn(task));
    }

    /// Tasks still running.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.tasks.lock().iter().filter(|t| !t.is_finished()).count()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn dropping_the_owner_stops_its_tasks() {
        let ticks = Arc::new(AtomicU64::new(0));
        let background = Background::default();
        for _ in 0..2 {
            let ticks = ticks.clone();
            background.spawn(async move {
                loop {
                    ticks.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
        }
        background.spawn(async {});
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(background.running(), 2, "a task that ended is not counted");
        assert!(ticks.load(Ordering::SeqCst) > 0);
        drop(background);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let after = ticks.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), after, "a task ran on after its owner was dropped");
        assert_eq!(Arc::strong_count(&ticks), 1, "the aborted tasks released what they held");
    }
}
