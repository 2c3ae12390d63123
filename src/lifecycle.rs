//! The process's lifecycle: whether it is stopping, and the work that must finish (and be
//! billed) before it exits.
//!
//! Stopping is a signal every long-lived stream watches: the dashboard's live feed ends,
//! realtime sessions close as going away, live calls are disconnected. Work that runs detached
//! from any connection (a realtime turn whose client has gone, billing itself) holds a
//! [`Work`] guard, and the server waits for those guards, up to a bound, before it exits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

/// Whether the process is stopping, and what is still running.
#[derive(Debug)]
pub struct Lifecycle {
    draining: AtomicBool,
    stopping: watch::Sender<bool>,
    work: AtomicUsize,
    idle: Notify,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            draining: AtomicBool::new(false),
            stopping: watch::channel(false).0,
            work: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }
}

/// A piece of work the process waits for before it exits; done when dropped.
#[derive(Debug)]
pub struct Work(Arc<Lifecycle>);

impl Drop for Work {
    fn drop(&mut self) {
        if self.0.work.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Lifecycle {
    /// Starts draining: new calls and realtime sessions are refused (503), the readiness
    /// check fails, and what runs goes on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// True once [`Lifecycle::drain`] or [`Lifecycle::stop`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire) || self.is_stopping()
    }

    /// Starts stopping: everything watching [`Lifecycle::stopped`] is told.
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// True once [`Lifecycle::stop`] was called.
    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Resolves once the process starts stopping.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stopping.subscribe();
        async move {
            // An error means the sender is gone: the process is going away all the same.
            let _ = rx.wait_for(|stopping| *stopping).await;
        }
    }

    /// Registers a piece of work to wait for.
    pub fn work(self: &Arc<Self>) -> Work {
        self.work.fetch_add(1, Ordering::AcqRel);
        Work(self.clone())
    }

    /// Work still running.
    pub fn running(&self) -> usize {
        self.work.load(Ordering::Acquire)
    }

    /// Waits until no work is running, for at most `within`; true when none is.
    pub async fn drained(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                tokio::pin!(idle);
                // Registered before the check, so a wake-up between the two is not missed.
                idle.as_mut().enable();
                if self.running() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stopping_is_seen_and_work_is_waited_for() {
        let life = Arc::new(Lifecycle::default());
        let stopped = life.stopped();
        let work = life.work();
        assert!(!life.is_stopping());
        assert!(!life.drained(Duration::from_millis(20)).await);
        life.stop();
        stopped.await;
        assert!(life.is_stopping());
        let waiter = {
            let life = life.clone();
            tokio::spawn(async move { life.drained(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(work);
        assert!(waiter.await.unwrap());
        assert_eq!(life.running(), 0);
    }
}
