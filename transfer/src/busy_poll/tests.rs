use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

#[test]
fn misses_skip_twice_as_many_waits_each_time_up_to_the_cap_and_a_hit_resets() {
    let a = Adaptive::default();
    assert!(a.should_spin());
    let skipped = |a: &Adaptive| (0..).take_while(|_| !a.should_spin()).count();
    a.miss();
    assert_eq!(skipped(&a), 1);
    a.miss();
    assert_eq!(skipped(&a), 2);
    a.miss();
    assert_eq!(skipped(&a), 4);
    for _ in 0..10 {
        a.miss();
    }
    assert_eq!(skipped(&a), MAX_SKIP as usize);
    a.hit();
    a.miss();
    assert_eq!(skipped(&a), 1, "a hit starts the backoff over");
}

#[tokio::test(flavor = "current_thread")]
async fn a_spinning_wait_lets_other_tasks_run_and_counts_a_hit() {
    let a = Adaptive::default();
    a.miss();
    a.miss();
    while !a.should_spin() {}
    let (tx, rx) = tokio::sync::oneshot::channel();
    // The sender runs only when the spinner yields: one that held the thread would hang.
    tokio::spawn(async move { tx.send(7).unwrap() });
    assert_eq!(spin(rx, Duration::from_secs(3600), &a).await.unwrap(), 7);
    a.miss();
    assert_eq!(a.skipping(), 1, "the hit reset the backoff");
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_longer_than_the_window_counts_a_miss_and_then_sleeps_until_the_answer() {
    let a = Arc::new(Adaptive::default());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let seen = a.clone();
    // Answers only once the spinner has given up (recorded its miss).
    tokio::spawn(async move {
        while seen.skipping() == 0 {
            tokio::task::yield_now().await;
        }
        tx.send(9).unwrap();
    });
    assert_eq!(spin(rx, Duration::from_micros(1), &a).await.unwrap(), 9);
    assert_eq!(a.skipping(), 1);
    // Zero window: a plain await that neither spins nor counts.
    let (tx, rx) = tokio::sync::oneshot::channel();
    tx.send(1).unwrap();
    assert_eq!(spin(rx, Duration::ZERO, &a).await.unwrap(), 1);
    assert_eq!(a.skipping(), 1);
}

/// A connection that counts the reads it found nothing to read on.
struct Counting {
    io: DuplexStream,
    empty_reads: Arc<AtomicUsize>,
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if r.is_pending() {
            self.empty_reads.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A server answering one 4-byte request and waiting for the next on a [`BusyPoll`] with
/// `window`; a client that, once answered, lets the runtime turn `turns` times (stopping
/// early once the server has read nothing `enough` times) before it sends the next request.
/// Answers the server's empty reads during those turns.
async fn empty_reads_while_waiting(window: Duration, turns: usize, enough: usize) -> usize {
    let (client, server) = tokio::io::duplex(64);
    let empty_reads = Arc::new(AtomicUsize::new(0));
    let counted = Counting {
        io: server,
        empty_reads: empty_reads.clone(),
    };
    let server = tokio::spawn(async move {
        let mut conn = BusyPoll::new(counted, window);
        let mut req = [0u8; 4];
        conn.read_exact(&mut req).await.unwrap();
        conn.write_all(b"ans1").await.unwrap();
        conn.read_exact(&mut req).await.unwrap();
        req
    });
    let mut client = client;
    client.write_all(b"req1").await.unwrap();
    let mut ans = [0u8; 4];
    client.read_exact(&mut ans).await.unwrap();
    assert_eq!(&ans, b"ans1");
    let before = empty_reads.load(Ordering::Relaxed);
    for _ in 0..turns {
        if empty_reads.load(Ordering::Relaxed) - before >= enough {
            break;
        }
        tokio::task::yield_now().await;
    }
    let during = empty_reads.load(Ordering::Relaxed) - before;
    client.write_all(b"req2").await.unwrap();
    assert_eq!(&server.await.unwrap(), &b"req2"[..]);
    during
}

#[tokio::test(flavor = "current_thread")]
async fn an_answered_connection_keeps_polling_for_the_next_request() {
    let polls = empty_reads_while_waiting(Duration::from_secs(3600), 100_000, 50).await;
    assert!(polls >= 50, "the server read {polls} times while waiting");
}

#[tokio::test(flavor = "current_thread")]
async fn a_connection_sleeps_once_its_window_is_over_or_without_one() {
    for window in [Duration::ZERO, Duration::from_micros(1)] {
        let polls = empty_reads_while_waiting(window, 1000, usize::MAX).await;
        assert!(
            polls <= 3,
            "{window:?}: the server read {polls} times while waiting"
        );
    }
}

#[test]
fn nothing_spins_while_memory_is_faulted_in() {
    let a = Adaptive::default();
    FAULTING_IN.with(|f| f.set(true));
    assert!(!a.should_spin());
    FAULTING_IN.with(|f| f.set(false));
    assert!(a.should_spin());
    assert_eq!(a.skipping(), 0, "a wait left to the prefault is not a miss");
}
