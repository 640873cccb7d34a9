//! The queues of one watch stream: the cache tasks' messages to its session, and the session's
//! batches to its transport. A FIFO under a mutex that allocates only what it holds.
//!
//! tokio's `mpsc` allocates a channel of cache-padded fields (512 bytes) and a first block of
//! 32 slots as soon as it is made; for the two queues of every stream that was 3.9 KiB of a
//! stream's 14 KiB of heap (valgrind's massif, 2 000 idle streams), the largest share after the
//! session's own task. Here a stream's queue is one small allocation, its buffer grows with
//! what is queued and is given back once the queue empties after a burst. Each queue has one
//! receiver; the bounded one has one sender that waits for room.
//!
//! Counterpart: what `cacheWatcher.input` (a Go channel) and the gRPC stream's send buffer do
//! for a Kubernetes watcher (`cache_watcher.go`).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A buffer larger than this many items is given back when the queue empties.
const KEEP_ITEMS: usize = 8;

struct State<T> {
    items: VecDeque<T>,
    /// The receiver waits for an item.
    rx_waker: Option<Waker>,
    /// The (bounded queue's) sender waits for room.
    room_waker: Option<Waker>,
    /// The sender waits for the receiver to go away.
    closed_waker: Option<Waker>,
    rx_gone: bool,
    tx_gone: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    senders: AtomicUsize,
    /// Most items queued at once (`usize::MAX`: unbounded).
    cap: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding the lock leaves the queue as it was (every change is one push
        // or pop): go on with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// Why an item was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError<T> {
    /// The bounded queue holds `cap` items.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

/// The sending side (cloneable: the cache tasks each keep one per session).
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving side.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A queue without a bound (the caches bound what they send by credit).
pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    with_cap(usize::MAX)
}

/// A queue of at most `cap` items (at least 1).
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    with_cap(cap.max(1))
}

fn with_cap<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            rx_waker: None,
            room_waker: None,
            closed_waker: None,
            rx_gone: false,
            tx_gone: false,
        }),
        senders: AtomicUsize::new(1),
        cap,
    });
    (Sender { shared: shared.clone() }, Receiver { shared })
}

impl<T> Sender<T> {
    /// Queues `item` unless the queue is full or its receiver gone.
    pub fn try_send(&self, item: T) -> Result<(), SendError<T>> {
        let waker = {
            let mut st = self.shared.lock();
            if st.rx_gone {
                return Err(SendError::Closed(item));
            }
            if st.items.len() >= self.shared.cap {
                return Err(SendError::Full(item));
            }
            st.items.push_back(item);
            st.rx_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Queues `item` (a queue without a bound is never full); `Err` gives it back when the
    /// receiver is gone.
    pub fn send(&self, item: T) -> Result<(), T> {
        self.try_send(item).map_err(|e| match e {
            SendError::Full(t) | SendError::Closed(t) => t,
        })
    }

    /// Whether an item would be taken now (room, or the receiver gone: then sending fails at
    /// once).
    pub fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.shared.lock();
        if st.rx_gone || st.items.len() < self.shared.cap {
            return Poll::Ready(());
        }
        register(&mut st.room_waker, cx);
        Poll::Pending
    }

    /// Waits until [`Sender::poll_ready`].
    pub async fn ready(&self) {
        poll_fn(|cx| self.poll_ready(cx)).await
    }

    /// Waits for room, then queues `item`; `Err` gives it back when the receiver is gone.
    pub async fn send_wait(&self, mut item: T) -> Result<(), T> {
        loop {
            self.ready().await;
            match self.try_send(item) {
                Ok(()) => return Ok(()),
                Err(SendError::Closed(t)) => return Err(t),
                // Another sender took the room.
                Err(SendError::Full(t)) => item = t,
            }
        }
    }

    /// Whether an item would be queued now (for a queue's only sender: then it is).
    pub fn has_room(&self) -> bool {
        let st = self.shared.lock();
        !st.rx_gone && st.items.len() < self.shared.cap
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().rx_gone
    }

    /// Waits until the receiver is gone.
    pub async fn closed(&self) {
        poll_fn(|cx| {
            let mut st = self.shared.lock();
            if st.rx_gone {
                return Poll::Ready(());
            }
            register(&mut st.closed_waker, cx);
            Poll::Pending
        })
        .await
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Sender")
            .field("queued", &st.items.len())
            .field("closed", &st.rx_gone)
            .finish()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Sender { shared: self.shared.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let waker = {
            let mut st = self.shared.lock();
            st.tx_gone = true;
            st.rx_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Why nothing was received.
#[derive(Debug, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing is queued.
    Empty,
    /// Nothing is queued and every sender is gone.
    Disconnected,
}

impl<T> Receiver<T> {
    /// Takes the front item (giving a large buffer back once empty); the waker of a sender
    /// that waits for room comes with it.
    fn pop(st: &mut State<T>) -> Option<(T, Option<Waker>)> {
        let item = st.items.pop_front()?;
        if st.items.is_empty() && st.items.capacity() > KEEP_ITEMS {
            st.items = VecDeque::new();
        }
        Some((item, st.room_waker.take()))
    }

    fn woken(item: T, room: Option<Waker>) -> T {
        if let Some(w) = room {
            w.wake();
        }
        item
    }

    /// The next item, if one is queued.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut st = self.shared.lock();
        match Self::pop(&mut st) {
            Some((item, room)) => {
                drop(st);
                Ok(Self::woken(item, room))
            }
            None if st.tx_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// The next item; `None` once every sender is gone and nothing is left.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut st = self.shared.lock();
        match Self::pop(&mut st) {
            Some((item, room)) => {
                drop(st);
                Poll::Ready(Some(Self::woken(item, room)))
            }
            None if st.tx_gone => Poll::Ready(None),
            None => {
                register(&mut st.rx_waker, cx);
                Poll::Pending
            }
        }
    }

    /// Waits for [`Receiver::poll_recv`].
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let (items, room, closed) = {
            let mut st = self.shared.lock();
            st.rx_gone = true;
            (std::mem::take(&mut st.items), st.room_waker.take(), st.closed_waker.take())
        };
        // What was queued is dropped outside the lock (a batch gives back its budget).
        drop(items);
        for w in [room, closed].into_iter().flatten() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn items_arrive_in_order_and_the_end_is_seen_once_every_sender_is_gone() {
        let (tx, mut rx) = unbounded::<u32>();
        let tx2 = tx.clone();
        for i in 0..100 {
            tx.send(i).unwrap();
        }
        drop(tx);
        let h = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx2.send(100).unwrap();
        });
        let mut got = Vec::new();
        while let Some(i) = rx.recv().await {
            got.push(i);
        }
        h.await.unwrap();
        assert_eq!(got, (0..=100).collect::<Vec<_>>());
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    #[tokio::test]
    async fn a_bounded_queue_refuses_when_full_and_its_sender_waits_for_room() {
        let (tx, mut rx) = bounded::<u32>(2);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert_eq!(tx.try_send(3), Err(SendError::Full(3)));
        let waiter = tokio::spawn(async move {
            tx.send_wait(3).await.unwrap();
            tx
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the sender waits while the queue is full");
        assert_eq!(rx.recv().await, Some(1));
        let tx = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert_eq!(rx.try_recv(), Ok(2));
        assert_eq!(rx.try_recv(), Ok(3));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.try_send(4), Err(SendError::Closed(4)));
        // A sender waiting for room or for the end wakes when the receiver goes.
        tokio::time::timeout(Duration::from_secs(5), tx.closed()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), tx.ready()).await.unwrap();
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_for_an_item_and_a_waiting_sender_for_the_receivers_drop() {
        let (tx, mut rx) = unbounded::<u32>();
        let r = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(7).unwrap();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), r).await.unwrap().unwrap(),
            Some(7)
        );
        let (tx, rx) = bounded::<u32>(1);
        let c = tokio::spawn(async move { tx.closed().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), c).await.unwrap().unwrap();
    }

    #[test]
    fn a_drained_queue_gives_its_buffer_back_after_a_burst() {
        let (tx, mut rx) = unbounded::<[u8; 48]>();
        for _ in 0..1000 {
            tx.send([0; 48]).unwrap();
        }
        assert!(rx.shared.lock().items.capacity() >= 1000);
        while rx.try_recv().is_ok() {}
        assert_eq!(rx.shared.lock().items.capacity(), 0);
        // A small queue keeps its buffer (no allocation per message).
        for _ in 0..3 {
            tx.send([0; 48]).unwrap();
        }
        while rx.try_recv().is_ok() {}
        assert!(rx.shared.lock().items.capacity() > 0);
    }

    #[test]
    fn queued_items_are_dropped_with_the_receiver() {
        let (tx, rx) = unbounded::<Arc<()>>();
        let item = Arc::new(());
        tx.send(item.clone()).unwrap();
        assert_eq!(Arc::strong_count(&item), 2);
        drop(rx);
        assert_eq!(Arc::strong_count(&item), 1);
    }
}
