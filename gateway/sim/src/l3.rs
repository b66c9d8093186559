//! L3 for the simulated worker: the storage tier of SGLang's hierarchical cache
//! (`--enable-hierarchical-cache --hicache-storage-backend mooncake`) on Moongate's store
//! (`--kv-store <master-url>`).
//!
//! - **Names.** A page is stored as SGLang's Mooncake backend stores it: two objects,
//!   `{page hash}_0_k` and `{page hash}_0_v` (tensor-parallel rank 0, MHA), each half of
//!   the page's bytes, under HiCache's chained page hash ([`sglang::hicache`]).
//! - **Writes.** Pages the prefix cache evicts (`--kv-store-write-policy write-back`, the
//!   default) or computes (`write-through`, SGLang's default) are queued ([`L3::spill`])
//!   and written by one background task: the names the store lacks, in one `batch_put`
//!   (SGLang's `batch_set` also asks which exist first). A page another worker wrote
//!   first is left as it is. The queue is bounded: pages that do not fit are dropped and
//!   counted, never waited for on the request path.
//! - **Loads.** Before a prompt is computed, the pages after its cached prefix are looked
//!   up (`batch_exists`) and those in a row from there are read (`batch_get_into`) into a
//!   registered buffer, through the transfer engine, in as many batches as the buffer
//!   needs; each object's bytes are checked. The time it takes is the request's: the
//!   first token waits for the load. Pages loaded count as cached
//!   ([`super::prefix::PrefixCache::admit_pages`]).
//! - **Bytes.** An object holds its page digest and which half it is, then that digest
//!   repeated: checkable without the prompt, so a load that read the wrong bytes is
//!   refused and the page computed instead.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use kvclient::{BufRange, ClientConfig, StoreClient, StoreError};
use kvclient::{Prefault, Protocol};
use openapi::master::MasterError;
use serde::Serialize;
use sglang::hicache::{KeyLayout, PageHash};
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;
use transfer::RegisteredBuffer;

use super::config::{KvTransport, SimConfig};
use sglang::kv_events::hash::PageDigest;

/// Batches of pages that may wait to be written.
pub const SPILL_QUEUE: usize = 256;
/// Most pages one write to the store carries.
pub const MAX_SPILL_PAGES: usize = 256;

/// L3 counters (`GET /sim/prefix`, under `store`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct L3Stats {
    /// Pages written to the store.
    pub written_pages: u64,
    /// Pages queued that the store already held (another worker wrote them first).
    pub present_pages: u64,
    /// Pages whose write failed.
    pub write_failures: u64,
    /// Pages dropped because the write queue was full.
    pub dropped_pages: u64,
    /// Prompts whose next pages were looked up in the store.
    pub lookups: u64,
    /// Pages loaded from the store.
    pub loaded_pages: u64,
    /// Bytes loaded from the store.
    pub loaded_bytes: u64,
    /// Time spent loading, in microseconds (lookups included).
    pub load_micros: u64,
    /// Loads cut short by a failed read or bytes that did not check.
    pub load_failures: u64,
}

#[derive(Debug, Default)]
struct Counters {
    written_pages: AtomicU64,
    present_pages: AtomicU64,
    write_failures: AtomicU64,
    dropped_pages: AtomicU64,
    lookups: AtomicU64,
    loaded_pages: AtomicU64,
    loaded_bytes: AtomicU64,
    load_micros: AtomicU64,
    load_failures: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One worker's store client and its write queue.
#[derive(Debug)]
pub struct L3 {
    client: StoreClient,
    layout: KeyLayout,
    /// Bytes of one object (half a page).
    object_bytes: usize,
    buf: Mutex<RegisteredBuffer>,
    spill: mpsc::Sender<Vec<PageDigest>>,
    counters: Arc<Counters>,
    writer: tokio::task::JoinHandle<()>,
}

impl L3 {
    /// Connects to the master `cfg.kv_store` names, mounts this worker's segment, and
    /// starts the writer. Fails when the master cannot be reached or refuses the mount.
    pub async fn connect(cfg: &SimConfig) -> anyhow::Result<Self> {
        let master = cfg.kv_store.clone().context("kv_store is not set")?;
        let host: IpAddr = cfg.host.parse().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let client_cfg = ClientConfig {
            master: master.clone(),
            segment_size: cfg.kv_store_segment_size,
            // The sim's pages are small and many; puts go through this copy buffer.
            local_buffer_size: cfg.kv_store_buffer_size,
            prefault: Prefault::Off,
            listen: SocketAddr::new(host, 0),
            protocol: match cfg.kv_transport {
                KvTransport::Auto => Protocol::Auto,
                KvTransport::Tcp => Protocol::Tcp,
            },
            transfer_secret_file: cfg.transfer_secret_file.clone(),
            disk_path: cfg.kv_store_disk_path.clone(),
            disk_capacity: cfg.kv_store_disk_capacity,
            ..ClientConfig::default()
        };
        let client = StoreClient::connect(client_cfg)
            .await
            .with_context(|| format!("kv_store: connecting to the KV master at {master}"))?;
        let buf = client
            .alloc(cfg.kv_store_buffer_size as usize)
            .context("kv_store: allocating the load buffer")?;
        let page = cfg.model_shape.bytes_per_token() * cfg.page_size as usize;
        let layout = KeyLayout::mha(0);
        let object_bytes = page / layout.objects_per_page();
        let counters = Arc::new(Counters::default());
        let (spill, rx) = mpsc::channel(SPILL_QUEUE);
        let writer = tokio::spawn(write_loop(
            client.clone(),
            layout.clone(),
            object_bytes,
            rx,
            counters.clone(),
        ));
        Ok(L3 {
            client,
            layout,
            object_bytes,
            buf: Mutex::new(buf),
            spill,
            counters,
            writer,
        })
    }

    /// Queues pages for the store (dropped, and counted, when the queue is full).
    pub fn spill(&self, digests: Vec<PageDigest>) {
        if digests.is_empty() {
            return;
        }
        if let Err(e) = self.spill.try_send(digests) {
            let n = match &e {
                mpsc::error::TrySendError::Full(d) | mpsc::error::TrySendError::Closed(d) => {
                    d.len()
                }
            };
            add(&self.counters.dropped_pages, n as u64);
        }
    }

    /// Loads the pages of `digests` the store holds in a row from the first: how many
    /// were loaded (and checked).
    pub async fn load(&self, digests: &[PageDigest]) -> usize {
        use tracing::Instrument;
        if digests.is_empty() {
            return 0;
        }
        // A span for a process that exports traces (TRACE: no other subscriber takes it),
        // around the store client's own: the request's time spent on the store.
        let span = tracing::trace_span!(target: "sim::l3", "kv_load", pages = digests.len(),
            loaded_pages = tracing::field::Empty);
        let loaded = self.load_in(digests).instrument(span.clone()).await;
        span.record("loaded_pages", loaded);
        loaded
    }

    async fn load_in(&self, digests: &[PageDigest]) -> usize {
        let t = Instant::now();
        add(&self.counters.lookups, 1);
        let pages: Vec<PageHash> = digests.iter().map(|d| PageHash(*d)).collect();
        let keys = self.layout.keys_of(&pages);
        let per = self.layout.objects_per_page();
        let found = self.client.batch_exists(&keys).await;
        let n = found
            .chunks(per)
            .take_while(|c| c.iter().all(|r| matches!(r, Ok(true))))
            .count();
        let loaded = if n == 0 {
            0
        } else {
            self.read(&keys[..n * per], &digests[..n]).await
        };
        add(&self.counters.loaded_pages, loaded as u64);
        add(
            &self.counters.loaded_bytes,
            (loaded * per * self.object_bytes) as u64,
        );
        add(&self.counters.load_micros, t.elapsed().as_micros() as u64);
        loaded
    }

    /// Reads the objects `keys` of the pages `digests` in buffer-sized batches; stops at
    /// the first page that fails.
    async fn read(&self, keys: &[String], digests: &[PageDigest]) -> usize {
        let buf = self.buf.lock().await;
        let (obj, per) = (self.object_bytes, self.layout.objects_per_page());
        let batch = (buf.len() / (obj * per)).max(1);
        let (mut want, mut got) = (Vec::with_capacity(obj), vec![0u8; obj]);
        let mut loaded = 0;
        for first in (0..digests.len()).step_by(batch) {
            let last = (first + batch).min(digests.len());
            let items: Vec<(&str, BufRange<'_>)> = keys[first * per..last * per]
                .iter()
                .enumerate()
                .map(|(j, k)| (k.as_str(), BufRange::new(&buf, j * obj, obj)))
                .collect();
            let results = self.client.batch_get_into(&items).await;
            for (p, r) in results.chunks(per).enumerate() {
                let ok = r.iter().enumerate().all(|(half, len)| {
                    let at = (p * per + half) * obj;
                    object_bytes(&digests[first + p], half as u8, obj, &mut want);
                    matches!(len, Ok(l) if *l as usize == obj)
                        && buf.read_at(at, &mut got).is_ok()
                        && got == want
                });
                if !ok {
                    add(&self.counters.load_failures, 1);
                    return loaded;
                }
                loaded += 1;
            }
        }
        loaded
    }

    /// The counters so far.
    pub fn stats(&self) -> L3Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        L3Stats {
            written_pages: get(&c.written_pages),
            present_pages: get(&c.present_pages),
            write_failures: get(&c.write_failures),
            dropped_pages: get(&c.dropped_pages),
            lookups: get(&c.lookups),
            loaded_pages: get(&c.loaded_pages),
            loaded_bytes: get(&c.loaded_bytes),
            load_micros: get(&c.load_micros),
            load_failures: get(&c.load_failures),
        }
    }

    /// Stops the writer and unmounts this worker's segment (its pages leave the store).
    pub async fn close(&self) {
        self.writer.abort();
        if let Err(e) = self.client.close().await {
            tracing::warn!(error = %e, "kv_store: closing the store client");
        }
    }
}

impl Drop for L3 {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

/// Fills `out` with the `len` bytes of half `half` of the page whose digest is `digest`.
pub fn object_bytes(digest: &PageDigest, half: u8, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&digest[..len.min(32)]);
    if out.len() < len {
        out.push(half);
    }
    while out.len() < len {
        let take = (len - out.len()).min(32);
        out.extend_from_slice(&digest[..take]);
    }
}

/// Writes queued pages until the queue closes: a few batches at a time, skipping what
/// the store already holds.
async fn write_loop(
    client: StoreClient,
    layout: KeyLayout,
    obj: usize,
    mut rx: mpsc::Receiver<Vec<PageDigest>>,
    counters: Arc<Counters>,
) {
    let per = layout.objects_per_page();
    while let Some(mut batch) = rx.recv().await {
        while batch.len() < MAX_SPILL_PAGES {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        batch.sort_unstable();
        batch.dedup();
        for chunk in batch.chunks(MAX_SPILL_PAGES) {
            let pages: Vec<PageHash> = chunk.iter().map(|d| PageHash(*d)).collect();
            let keys = layout.keys_of(&pages);
            let found = client.batch_exists(&keys).await;
            let mut items = Vec::new();
            let mut item_page = Vec::new();
            let mut present = 0u64;
            for (i, (k, f)) in keys.iter().zip(&found).enumerate() {
                if matches!(f, Ok(true)) {
                    present += 1;
                    continue;
                }
                let mut v = Vec::with_capacity(obj);
                object_bytes(&chunk[i / per], (i % per) as u8, obj, &mut v);
                items.push((k.as_str(), v));
                item_page.push(i / per);
            }
            let results = client.batch_put(&items).await;
            let mut written = 0u64;
            let mut failed = vec![false; chunk.len()];
            for (r, &page) in results.iter().zip(&item_page) {
                match r {
                    Ok(()) => written += 1,
                    Err(StoreError::Master(MasterError::ObjectAlreadyExists(_))) => present += 1,
                    Err(e) => {
                        failed[page] = true;
                        tracing::debug!(error = %e, "kv_store: writing a page");
                    }
                }
            }
            let failed = failed.iter().filter(|f| **f).count();
            add(&counters.write_failures, failed as u64);
            add(&counters.written_pages, written / per as u64);
            add(&counters.present_pages, present / per as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_bytes_name_their_page_and_half() {
        let d = [7u8; 32];
        let (mut k, mut v) = (Vec::new(), Vec::new());
        object_bytes(&d, 0, 100, &mut k);
        object_bytes(&d, 1, 100, &mut v);
        assert_eq!((k.len(), v.len()), (100, 100));
        assert_eq!(&k[..32], &d);
        assert_ne!(k, v, "the halves differ");
        let mut other = Vec::new();
        object_bytes(&[8u8; 32], 0, 100, &mut other);
        assert_ne!(k, other, "pages differ");
        object_bytes(&d, 0, 16, &mut k);
        assert_eq!(k, d[..16]);
    }
}
