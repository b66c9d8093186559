//! Once a request is reported, nothing lands in its local buffer any more; and two threads
//! copying into one region never see each other's half-written bytes.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use transfer::tcp::frame::{REQUEST_HEADER_LEN, RequestHeader, ResponseHeader, Status};
use transfer::{EngineConfig, InMemoryMetadata, TransferEngine, TransferError, TransferRequest};

const LEN: usize = 64 << 10;
const OLD: u8 = 0xaa;
const NEW: u8 = 0x55;

/// How the fake peer answers a Read.
#[derive(Clone, Copy)]
enum Answer {
    /// Waits for the go, then sends the whole answer.
    LateWhole,
    /// Sends the header and half the data at once, the rest after the go.
    HalfThenRest,
}

/// An authenticated fake peer at `name` whose Read answers wait for `go`; answers every
/// other frame (a Notify) at once, in order.
async fn fake_peer(meta: &InMemoryMetadata, name: &str, answer: Answer, go: Arc<Notify>) {
    let listener = fake_listener(meta, name).await;
    authenticating_listener(listener, move |mut s| {
        let go = go.clone();
        async move {
            loop {
                let mut hb = [0u8; REQUEST_HEADER_LEN];
                if s.read_exact(&mut hb).await.is_err() {
                    return;
                }
                let h = RequestHeader::decode(&hb).unwrap();
                let mut payload = vec![0u8; h.op.payload_len(h.len) as usize];
                s.read_exact(&mut payload).await.unwrap();
                let data_len = if h.op == transfer::tcp::frame::Opcode::Read {
                    h.len
                } else {
                    0
                };
                let head = ResponseHeader {
                    status: Status::Ok,
                    request_id: h.request_id,
                    len: data_len,
                }
                .encode();
                if data_len == 0 {
                    let _ = s.write_all(&head).await;
                    continue;
                }
                let data = vec![NEW; data_len as usize];
                match answer {
                    Answer::LateWhole => {
                        go.notified().await;
                        let _ = s.write_all(&head).await;
                        let _ = s.write_all(&data).await;
                    }
                    Answer::HalfThenRest => {
                        let half = data.len() / 2;
                        let _ = s.write_all(&head).await;
                        let _ = s.write_all(&data[..half]).await;
                        go.notified().await;
                        let _ = s.write_all(&data[half..]).await;
                    }
                }
            }
        }
    });
}

async fn initiator(meta: Arc<InMemoryMetadata>) -> TransferEngine {
    engine_with(
        meta,
        EngineConfig {
            lanes_per_peer: 1,
            io_timeout: Duration::from_secs(60),
            ..config(false)
        },
    )
    .await
}

/// The answer arrives after the request timed out: it is drained, not delivered.
#[tokio::test]
async fn a_late_answer_to_a_timed_out_read_is_discarded() {
    let meta = Arc::new(InMemoryMetadata::new());
    let go = Arc::new(Notify::new());
    fake_peer(&meta, "late", Answer::LateWhole, go.clone()).await;
    let e = initiator(meta).await;
    let local = e.alloc(LEN).unwrap();
    local.write_at(0, &[OLD; LEN]).unwrap();
    let seg = e.open_segment("late").await.unwrap();
    let batch = e
        .submit_with_timeout(
            vec![TransferRequest::read(&local, 0, &seg, 1 << 20, LEN)],
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    assert!(matches!(
        batch.wait().await,
        Err(TransferError::TimedOut { .. })
    ));
    go.notify_one();
    // The connection survives (nothing was landing at the timeout); a later request on it
    // is answered after the late data, so once it completes that data was handled.
    e.notify(&seg, b"after").await.unwrap();
    assert_eq!(
        local.to_vec(0, LEN).unwrap(),
        vec![OLD; LEN],
        "the late data landed"
    );
}

/// The answer is arriving when the request times out: the connection is cut at once (not
/// after the I/O timeout), and the rest of the data never lands.
#[tokio::test]
async fn a_read_timing_out_mid_data_is_cut_and_lands_nothing_more() {
    let meta = Arc::new(InMemoryMetadata::new());
    let go = Arc::new(Notify::new());
    fake_peer(&meta, "half", Answer::HalfThenRest, go.clone()).await;
    let e = initiator(meta).await;
    let local = e.alloc(LEN).unwrap();
    local.write_at(0, &[OLD; LEN]).unwrap();
    let seg = e.open_segment("half").await.unwrap();
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let batch = e
        .submit_with_timeout(
            vec![TransferRequest::read(&local, 0, &seg, 1 << 20, LEN)],
            timeout,
        )
        .await
        .unwrap();
    assert!(matches!(
        batch.wait().await,
        Err(TransferError::TimedOut { .. })
    ));
    assert!(
        started.elapsed() < timeout + Duration::from_secs(5),
        "waited {:?}: the landing was not aborted",
        started.elapsed()
    );
    let snapshot = local.to_vec(0, LEN).unwrap();
    assert!(
        snapshot[..LEN / 2].iter().all(|&b| b == NEW),
        "the first half had landed"
    );
    go.notify_one();
    // The peer's remaining bytes go to a closed connection: a new request reconnects (and
    // is answered) only after them, and the buffer is unchanged.
    e.notify(&seg, b"after").await.unwrap();
    assert_eq!(
        local.to_vec(0, LEN).unwrap(),
        snapshot,
        "bytes landed after the timeout"
    );
}

/// Cancelling behaves as a timeout does.
#[tokio::test]
async fn a_cancelled_read_mid_data_lands_nothing_more() {
    let meta = Arc::new(InMemoryMetadata::new());
    let go = Arc::new(Notify::new());
    fake_peer(&meta, "cancel", Answer::HalfThenRest, go.clone()).await;
    let e = initiator(meta).await;
    let local = e.alloc(LEN).unwrap();
    local.write_at(0, &[OLD; LEN]).unwrap();
    let seg = e.open_segment("cancel").await.unwrap();
    let batch = e
        .submit(vec![TransferRequest::read(&local, 0, &seg, 1 << 20, LEN)])
        .await
        .unwrap();
    // Wait until the first half landed, then cancel.
    let started = Instant::now();
    while local.to_vec(LEN / 2 - 1, 1).unwrap()[0] != NEW {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the first half never came"
        );
        tokio::task::yield_now().await;
    }
    batch.cancel();
    assert!(matches!(
        batch.wait().await,
        Err(TransferError::Cancelled { .. })
    ));
    let snapshot = local.to_vec(0, LEN).unwrap();
    go.notify_one();
    e.notify(&seg, b"after").await.unwrap();
    assert_eq!(local.to_vec(0, LEN).unwrap(), snapshot);
}

/// Writers and readers of one registered region on several threads: every read sees one
/// whole write, never a mix (the copies exclude each other).
#[tokio::test]
async fn concurrent_safe_copies_never_tear() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let e = engine(false).await;
    let buf = e.alloc(1 << 20).unwrap();
    let chunk = 256 << 10;
    let writing = AtomicBool::new(true);
    let reads = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u8)
            .map(|w| {
                let buf = &buf;
                s.spawn(move || {
                    for k in 0..3000u32 {
                        let v = (k as u8).wrapping_mul(2).wrapping_add(w);
                        buf.write_at(0, &vec![v; chunk]).unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..2 {
            let (buf, writing, reads) = (&buf, &writing, &reads);
            s.spawn(move || {
                let mut got = vec![0u8; chunk];
                while writing.load(Ordering::Acquire) {
                    buf.read_at(0, &mut got).unwrap();
                    reads.fetch_add(1, Ordering::Relaxed);
                    let first = got[0];
                    assert!(got.iter().all(|&b| b == first), "a torn read");
                }
            });
        }
        for w in writers {
            w.join().unwrap();
        }
        writing.store(false, Ordering::Release);
    });
    assert!(reads.load(Ordering::Relaxed) > 0);
}
