//! A bounded pool of KV pages in one region registered with the transfer engine.
//!
//! Pages are handed out lowest index first (so a request's pages tend to be contiguous and
//! its transfers coalesce), and come back when the [`PageLease`] drops, whatever ended the
//! request. A request that needs more pages than are free waits; one that needs more than
//! the pool holds is refused at once.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use transfer::{RegisteredBuffer, TransferEngine};

/// The pool (cheap to share as `Arc<KvPool>`).
#[derive(Debug)]
pub struct KvPool {
    buf: RegisteredBuffer,
    page_bytes: usize,
    pages: usize,
    free: Mutex<BTreeSet<u32>>,
    room: Arc<Semaphore>,
}

/// Why pages could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// More pages than the whole pool.
    #[error("the prompt needs {need} KV pages but the pool holds {have}")]
    TooBig {
        /// Pages needed.
        need: usize,
        /// Pages in the pool.
        have: usize,
    },
    /// The pool was closed (shutdown).
    #[error("the KV pool is closed")]
    Closed,
}

impl KvPool {
    /// Registers `pages` pages of `page_bytes` bytes with `engine`.
    pub fn new(engine: &TransferEngine, page_bytes: usize, pages: usize) -> transfer::Result<Self> {
        let buf = engine.alloc(page_bytes * pages)?;
        Ok(Self {
            buf,
            page_bytes,
            pages,
            free: Mutex::new((0..pages as u32).collect()),
            room: Arc::new(Semaphore::new(pages)),
        })
    }

    /// The registered region.
    pub fn buffer(&self) -> &RegisteredBuffer {
        &self.buf
    }

    /// Bytes per page.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages free now.
    pub fn free_pages(&self) -> usize {
        self.free.lock().len()
    }

    /// Offset of page `idx` in the region.
    pub fn offset(&self, idx: u32) -> usize {
        idx as usize * self.page_bytes
    }

    /// Address of page `idx` (what a peer writes to).
    pub fn addr(&self, idx: u32) -> u64 {
        self.buf.addr() + self.offset(idx) as u64
    }

    /// Takes `n` pages, waiting while fewer are free.
    pub async fn lease(self: &Arc<Self>, n: usize) -> Result<PageLease, PoolError> {
        if n > self.pages {
            return Err(PoolError::TooBig {
                need: n,
                have: self.pages,
            });
        }
        let permit = self
            .room
            .clone()
            .acquire_many_owned(n as u32)
            .await
            .map_err(|_| PoolError::Closed)?;
        let pages = {
            let mut free = self.free.lock();
            let taken: Vec<u32> = free.iter().take(n).copied().collect();
            for p in &taken {
                free.remove(p);
            }
            taken
        };
        Ok(PageLease {
            pool: self.clone(),
            pages,
            _permit: permit,
        })
    }

    /// Stops handing out pages (waiting leases fail).
    pub fn close(&self) {
        self.room.close();
    }
}

/// Pages held by one request, returned to the pool on drop.
#[derive(Debug)]
pub struct PageLease {
    pool: Arc<KvPool>,
    pages: Vec<u32>,
    _permit: OwnedSemaphorePermit,
}

impl PageLease {
    /// The page indices, in prompt order.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    /// The pool they come from.
    pub fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }
}

impl Drop for PageLease {
    fn drop(&mut self) {
        // Pages go back before the permit (dropped after this) lets a waiter in.
        self.pool.free.lock().extend(self.pages.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use transfer::EngineConfig;

    #[tokio::test]
    async fn leases_wait_refuse_and_return() {
        let engine =
            TransferEngine::new(EngineConfig::listening_on("127.0.0.1:0".parse().unwrap()))
                .await
                .unwrap();
        let pool = Arc::new(KvPool::new(&engine, 4096, 4).unwrap());
        assert!(matches!(
            pool.lease(5).await,
            Err(PoolError::TooBig { need: 5, have: 4 })
        ));
        let a = pool.lease(3).await.unwrap();
        assert_eq!(a.pages(), &[0, 1, 2]);
        assert_eq!(pool.addr(2) - pool.addr(0), 8192);
        let waiting = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.lease(2).await.map(|l| l.pages().to_vec()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "waits while the pool is full");
        drop(a);
        let got = waiting.await.unwrap().unwrap();
        assert_eq!(got, vec![0, 1]);
        assert_eq!(pool.free_pages(), 4, "every page is back");
        engine.shutdown().await;
    }
}
