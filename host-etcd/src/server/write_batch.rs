//! One write per connection per scheduler round: what a connection's HTTP/2 task writes is
//! gathered and sent when the task next runs, so the responses of many streams (one revision
//! to every watch of a connection) leave in one `writev` instead of one each.
//!
//! Why it is needed: h2 writes a DATA frame whose payload is 256 bytes or more from the
//! payload itself, beside its own buffer, and must write that out before it can take the next
//! frame (`h2::codec::FramedWrite`, `CHAIN_THRESHOLD`). A stream's batch (ten watches' events
//! of 64-byte values, say) is larger than that, so every stream's batch cost a system call of
//! its own: at 10 puts/s to 1 000 streams on 25 connections, 10 000 `writev` a second.
//!
//! How: [`WriteBatch`] sits between the socket and the HTTP/2 (or TLS) layer. It takes every
//! write into its buffer. The first flush of a round that holds a large frame (less than
//! [`SMALL`] bytes is written at once) only asks for the task to be polled again
//! (the task goes to the back of the run queue, behind the sessions and streams that may still
//! add to it); the flush of the next round, or any read in that round, writes the buffer out.
//! A buffer of [`LIMIT`] bytes or more is written at once, and a write finds the socket full
//! before it takes more, so HTTP/2's flow control and backpressure are what they were; a
//! drained buffer is given back, so an idle connection holds none.
//!
//! etcd counterpart: none in etcd itself; grpc-go, which etcd serves with, writes a connection's
//! frames from one writer (`loopyWriter`) through a buffered writer it flushes when no more
//! frames are queued (`internal/transport/controlbuf.go`, `http_util.go`).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes gathered at most before they are written without waiting for the next round.
pub(crate) const LIMIT: usize = 64 << 10;

/// A flush that finds less than this gathered, with nothing put off before it, writes at once:
/// h2 flushes in the middle of a round after a DATA payload of 256 bytes or more
/// (`CHAIN_THRESHOLD`) or with its own buffer full, so a smaller flush is the end of a small
/// answer (a unary response, a watch's `created`, a PING's ack), which should not wait.
pub(crate) const SMALL: usize = 256;

/// What a round's first write reserves at least (the buffer grows from there).
const FIRST: usize = 4 << 10;

/// The most a round's first write reserves on the last round's account.
const HINT_MAX: usize = 2 * LIMIT;

/// An IO object whose writes are gathered per round (see the module's comment).
pub(crate) struct WriteBatch<T> {
    io: T,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    sent: usize,
    /// A flush was put off to the next round (and the task asked to run again).
    deferred: bool,
    /// The next round has begun: the put-off flush is due.
    due: bool,
    /// What the last drained round held: the next round's first write reserves that much, so
    /// a round's buffer is allocated once instead of grown by doubling from [`FIRST`] (each
    /// step a copy of what it held; 4 % of the server's CPU at 500 revisions/s to 1 000
    /// watchers). Only a number is kept: the buffer itself is still given back.
    hint: usize,
}

impl<T> WriteBatch<T> {
    pub(crate) fn new(io: T) -> Self {
        Self { io, buf: Vec::new(), sent: 0, deferred: false, due: false, hint: 0 }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }
}

impl<T: AsyncWrite + Unpin> WriteBatch<T> {
    /// Writes the gathered bytes out; `Ready(Ok)` once none are left.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        // Given back: an idle connection holds no buffer (h2 keeps its own 16 KiB).
        // (Halved rather than forgotten after a small round: a PING's ack between two rounds
        // of events does not cost the next one its size.)
        self.hint = self.buf.len().max(self.hint / 2).min(HINT_MAX);
        self.buf = Vec::new();
        self.sent = 0;
        self.deferred = false;
        self.due = false;
        Poll::Ready(Ok(()))
    }

    /// Before taking `n` more bytes: a full buffer is written out first.
    fn poll_room(&mut self, cx: &mut Context<'_>, n: usize) -> Poll<io::Result<()>> {
        if self.pending() >= LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve(n.max(FIRST).max(self.hint));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for WriteBatch<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // A read in the round after a put-off flush: the round has begun, so write out.
        if this.deferred {
            this.due = true;
            if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
                return Poll::Ready(Err(e));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteBatch<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_room(cx, data.len()))?;
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_room(cx, bufs.iter().map(|b| b.len()).sum()))?;
        let mut n = 0;
        for b in bufs {
            this.buf.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending() == 0 {
            return Pin::new(&mut this.io).poll_flush(cx);
        }
        let small = !this.deferred && this.pending() < SMALL;
        if !this.due && !small && this.pending() < LIMIT {
            // The first flush of this round: put it off to the next one.
            if !this.deferred {
                this.deferred = true;
                cx.waker().wake_by_ref();
            }
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for WriteBatch<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// A socket that records each write call and can refuse writes (a full send buffer).
    #[derive(Default)]
    struct Sock {
        writes: Vec<Vec<u8>>,
        full: bool,
        shut: bool,
    }

    impl AsyncRead for Sock {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Sock {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.full {
                return Poll::Pending;
            }
            self.writes.push(data.to_vec());
            Poll::Ready(Ok(data.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A waker that counts its wakes, and the batch under test on a recording socket.
    fn setup() -> (Arc<Count>, std::task::Waker, WriteBatch<Sock>) {
        let wakes = Arc::new(Count::default());
        (wakes.clone(), std::task::Waker::from(wakes), WriteBatch::new(Sock::default()))
    }

    fn write(b: &mut WriteBatch<Sock>, cx: &mut Context<'_>, data: &[u8]) -> Poll<usize> {
        Pin::new(b).poll_write(cx, data).map(|r| r.expect("write"))
    }

    fn flush(b: &mut WriteBatch<Sock>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(b).poll_flush(cx).map(|r| r.expect("flush"))
    }

    #[test]
    fn a_rounds_writes_leave_in_one_write_when_the_task_runs_again() {
        let (wakes, waker, mut b) = setup();
        let mut cx = Context::from_waker(&waker);
        // One round: three streams' frames of SMALL bytes or more, each followed by a flush (as
        // h2 does for a chained DATA frame), and a small one after them.
        let parts = [vec![1u8; SMALL], vec![2u8; 1300], vec![3u8; 400], b"end".to_vec()];
        for part in &parts {
            assert_eq!(write(&mut b, &mut cx, part), Poll::Ready(part.len()));
            assert_eq!(flush(&mut b, &mut cx), Poll::Ready(()));
        }
        assert!(b.io.writes.is_empty(), "nothing written in the round itself");
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "the task asked to run again, once");
        // The next round: its read says the round has begun, and the put-off bytes go out.
        let mut rb = [0u8; 8];
        let mut rb = ReadBuf::new(&mut rb);
        assert!(Pin::new(&mut b).poll_read(&mut cx, &mut rb).is_pending());
        assert_eq!(b.io.writes, vec![parts.concat()]);
        assert_eq!(flush(&mut b, &mut cx), Poll::Ready(()));
        assert_eq!(b.io.writes.len(), 1);
    }

    #[test]
    fn a_small_answer_is_written_at_once() {
        let (wakes, waker, mut b) = setup();
        let mut cx = Context::from_waker(&waker);
        let answer = vec![9u8; SMALL - 1];
        let _ = write(&mut b, &mut cx, &answer);
        assert_eq!(flush(&mut b, &mut cx), Poll::Ready(()));
        assert_eq!(b.io.writes, vec![answer]);
        assert_eq!(wakes.0.load(Ordering::Relaxed), 0, "no second round asked for");
    }

    #[test]
    fn the_next_rounds_flush_writes_out_without_a_read() {
        let (_, waker, mut b) = setup();
        let mut cx = Context::from_waker(&waker);
        let frame = vec![5u8; 600];
        let _ = write(&mut b, &mut cx, &frame);
        let _ = flush(&mut b, &mut cx);
        assert!(b.io.writes.is_empty());
        // A small write after a put-off flush waits with it.
        let _ = write(&mut b, &mut cx, b"a");
        let _ = flush(&mut b, &mut cx);
        assert!(b.io.writes.is_empty());
        // A read that finds the round begun writes; so does a due flush when a read did not.
        b.due = true;
        let _ = flush(&mut b, &mut cx);
        assert_eq!(b.io.writes, vec![[&frame[..], b"a"].concat()]);
        assert!(!b.deferred && !b.due);
    }

    #[test]
    fn a_full_buffer_is_written_at_once_and_a_full_socket_holds_the_writer_back() {
        let (_, waker, mut b) = setup();
        let mut cx = Context::from_waker(&waker);
        let big = vec![7u8; LIMIT];
        let _ = write(&mut b, &mut cx, &big);
        // At the limit a flush writes now.
        assert_eq!(flush(&mut b, &mut cx), Poll::Ready(()));
        assert_eq!(b.io.writes.len(), 1);
        assert_eq!(b.buf.capacity(), 0, "a drained buffer is given back");
        // With the socket full, a write beyond the limit waits instead of growing the buffer.
        let _ = write(&mut b, &mut cx, &big);
        b.io.full = true;
        assert!(write(&mut b, &mut cx, b"more").is_pending());
        assert_eq!(b.pending(), LIMIT);
        b.io.full = false;
        assert_eq!(write(&mut b, &mut cx, b"more"), Poll::Ready(4));
        assert_eq!(b.io.writes.len(), 2);
        assert_eq!(b.pending(), 4);
    }

    #[test]
    fn a_round_reserves_what_the_last_one_held_and_an_idle_connection_holds_none() {
        let (_, waker, mut b) = setup();
        let mut cx = Context::from_waker(&waker);
        // A round of many frames, written out by the next round's flush.
        let frame = vec![4u8; 1000];
        for _ in 0..40 {
            let _ = write(&mut b, &mut cx, &frame);
            let _ = flush(&mut b, &mut cx);
        }
        b.due = true;
        assert_eq!(flush(&mut b, &mut cx), Poll::Ready(()));
        assert_eq!(b.io.writes, vec![frame.repeat(40)]);
        assert_eq!(b.buf.capacity(), 0, "a drained buffer is given back");
        // The next round's first frame reserves the whole of the last round: no growth.
        let _ = write(&mut b, &mut cx, &frame);
        let reserved = b.buf.capacity();
        assert!(reserved >= 40_000, "reserved {reserved}");
        for _ in 1..40 {
            let _ = write(&mut b, &mut cx, &frame);
        }
        assert_eq!(b.buf.capacity(), reserved, "the round fit in what it reserved");
        b.due = true;
        assert_eq!(flush(&mut b, &mut cx), Poll::Ready(()));
        // A small answer between rounds goes at once and leaves half the hint.
        let _ = write(&mut b, &mut cx, b"ping ack");
        assert_eq!(flush(&mut b, &mut cx), Poll::Ready(()));
        assert_eq!(b.buf.capacity(), 0);
        assert!(b.hint >= 20_000, "hint {}", b.hint);
        // Never more than HINT_MAX on the last round's account, however large a round.
        let big = vec![6u8; HINT_MAX * 2];
        let _ = write(&mut b, &mut cx, &big);
        let _ = write(&mut b, &mut cx, b"y");
        assert!(b.hint <= HINT_MAX, "hint {}", b.hint);
    }

    #[tokio::test]
    async fn shutdown_writes_what_is_gathered_first() {
        let mut b = WriteBatch::new(Sock::default());
        let last = vec![4u8; 1000];
        poll_fn(|cx| Pin::new(&mut b).poll_write(cx, &last)).await.expect("write");
        poll_fn(|cx| Pin::new(&mut b).poll_flush(cx)).await.expect("flush");
        assert!(b.io.writes.is_empty());
        poll_fn(|cx| Pin::new(&mut b).poll_shutdown(cx)).await.expect("shutdown");
        assert_eq!(b.io.writes, vec![last]);
        assert!(b.io.shut);
    }

    #[tokio::test]
    async fn over_a_real_socket_every_byte_arrives_in_order() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let reader = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut all = Vec::new();
            s.read_to_end(&mut all).await.expect("read");
            all
        });
        let mut b = WriteBatch::new(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        let mut expected = Vec::new();
        for i in 0..2000u32 {
            let chunk = vec![(i % 251) as u8; (i as usize * 37) % 3000 + 1];
            b.write_all(&chunk).await.expect("write");
            expected.extend_from_slice(&chunk);
            if i % 7 == 0 {
                b.flush().await.expect("flush");
                tokio::task::yield_now().await;
            }
        }
        b.shutdown().await.expect("shutdown");
        assert_eq!(reader.await.expect("reader"), expected);
    }
}
