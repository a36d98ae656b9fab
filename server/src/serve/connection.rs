//! Connections ([`serve`]): hyper's HTTP/1 server on each accepted socket, and their timeouts.
//!
//! A watchdog closes a connection that has no request in progress once it has been idle (no byte
//! received) for `--idle-timeout-ms`, or once a request head has been arriving for
//! `--read-timeout-ms`; a body gets `--read-timeout-ms` too (408 past it, [`super::routes`]).
//! Sockets beyond `--max-conns` are marked not admitted (their requests are answered 503 and the
//! connection closed, [`super::guard`]). Shutdown stops accepting, lets the requests in
//! progress (and open streams) finish, then joins the engine thread.

use super::metrics::Metrics;
use super::state::{AppState, ServerLimits};
use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;
use axum::Router;
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// One accepted connection's state, shared by its socket wrapper, its requests and its
/// watchdog (times are milliseconds since `opened`).
#[derive(Debug)]
pub struct ConnState {
    /// The connection got one of the `--max-conns` slots.
    pub admitted: bool,
    opened: Instant,
    metrics: Arc<Metrics>,
    /// Requests in progress on this connection.
    active: AtomicUsize,
    /// When the connection last became idle (accepted, or a response ended).
    idle_since: AtomicU64,
    /// When the first byte of the next request head arrived; `NO_HEAD` while none has.
    head_since: AtomicU64,
    /// Wakes the watchdog when a head starts, so it can move to the shorter deadline.
    head_started: tokio::sync::Notify,
}

const NO_HEAD: u64 = u64::MAX;

impl ConnState {
    fn open(metrics: &Arc<Metrics>, max_conns: usize) -> Arc<ConnState> {
        let before = metrics.open_connections.fetch_add(1, Ordering::SeqCst);
        Arc::new(ConnState {
            admitted: before < max_conns,
            opened: Instant::now(),
            metrics: metrics.clone(),
            active: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NO_HEAD),
            head_started: tokio::sync::Notify::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Why the watchdog should close the connection now, if it should; else how long to wait
    /// before asking again.
    fn expired(&self, idle: Duration, read: Duration) -> Result<Duration, &'static str> {
        let now = self.now_ms();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 4);
        if self.active.load(Ordering::SeqCst) > 0 {
            return Ok(idle.min(read));
        }
        let (since, limit, why) = match self.head_since.load(Ordering::SeqCst) {
            NO_HEAD => (
                self.idle_since.load(Ordering::SeqCst),
                ms(idle),
                "idle timeout",
            ),
            t => (t, ms(read), "request head timeout"),
        };
        match (since + limit).checked_sub(now) {
            Some(left) if left > 0 => Ok(Duration::from_millis(left)),
            _ => Err(why),
        }
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        self.metrics.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks a request in progress on its connection until dropped (with the response body).
struct Active(Arc<ConnState>);

impl Active {
    fn start(conn: &Arc<ConnState>) -> Active {
        conn.active.fetch_add(1, Ordering::SeqCst);
        conn.head_since.store(NO_HEAD, Ordering::SeqCst);
        Active(conn.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let c = &self.0;
        c.idle_since.store(c.now_ms(), Ordering::SeqCst);
        c.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The accepted socket: notes when a request head starts arriving.
#[derive(Debug)]
struct TrackedStream {
    stream: TcpStream,
    conn: Arc<ConnState>,
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before && self.conn.active.load(Ordering::SeqCst) == 0 {
            let now = self.conn.now_ms();
            let started = self.conn.head_since.compare_exchange(
                NO_HEAD,
                now,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            if started.is_ok() {
                self.conn.head_started.notify_one();
            }
        }
        polled
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Serves `app` (the router over `state`) on `listener` until `shutdown` resolves, then drains: the listener closes,
/// idle connections close, requests in progress (and open streams) finish, the engine thread is
/// joined.
///
/// Errors: none from accepting (a failed accept is logged and retried after 50 ms); the engine
/// thread's join failure.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!("TCP_NODELAY: {e}");
        }
        let conn = ConnState::open(&state.metrics, state.limits.max_conns);
        conns.spawn(serve_connection(
            stream,
            conn,
            app.clone(),
            state.limits.clone(),
            closing.clone(),
        ));
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = closing_tx.send(true);
    while conns.join_next().await.is_some() {}
    let engine_state = state.clone();
    tokio::task::spawn_blocking(move || engine_state.engine.shutdown())
        .await
        .map_err(std::io::Error::other)
}

/// Serves one connection until the client closes it, the watchdog expires it, or the server
/// drains (`closing` turns true: hyper finishes the request in progress, then closes).
async fn serve_connection(
    stream: TcpStream,
    conn: Arc<ConnState>,
    app: Router,
    limits: ServerLimits,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let io = TokioIo::new(TrackedStream {
        stream,
        conn: conn.clone(),
    });
    let on_conn = conn.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let active = Active::start(&on_conn);
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(on_conn.clone());
        let app = app.clone();
        async move {
            let resp = app.oneshot(req).await?;
            Ok::<_, Infallible>(on_end(resp, move |_| drop(active)))
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(None);
    let mut served = std::pin::pin!(http.serve_connection(io, service));
    let mut watchdog = std::pin::pin!(async {
        loop {
            match conn.expired(limits.idle_timeout, limits.read_timeout) {
                Ok(wait) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = conn.head_started.notified() => {}
                    }
                }
                Err(why) => return why,
            }
        }
    });
    let mut draining = *closing.borrow();
    if draining {
        served.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection: {e}");
                }
                return;
            }
            why = &mut watchdog => {
                tracing::debug!("closing a connection: {why}");
                return;
            }
            changed = closing.changed(), if !draining => {
                if changed.is_err() || *closing.borrow() {
                    draining = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Wraps `resp`'s body so that `done` runs exactly once: with `true` when the body was sent to its
/// end, with `false` when it was dropped before (the client went away).
pub(super) fn on_end<F>(resp: Response, done: F) -> Response
where
    F: FnOnce(bool) + Send + Unpin + 'static,
{
    resp.map(|inner| {
        Body::new(OnEnd {
            inner,
            done: Some(done),
        })
    })
}

struct OnEnd<F: FnOnce(bool)> {
    inner: Body,
    done: Option<F>,
}

impl<F: FnOnce(bool)> OnEnd<F> {
    fn finish(&mut self, completed: bool) {
        if let Some(done) = self.done.take() {
            done(completed);
        }
    }
}

impl<F: FnOnce(bool) + Unpin> HttpBody for OnEnd<F> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.finish(true),
            Poll::Ready(Some(Err(_))) => self.finish(false),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.finish(true),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<F: FnOnce(bool)> Drop for OnEnd<F> {
    fn drop(&mut self) {
        // A body that is empty from the start is never polled.
        let completed = self.inner.is_end_stream();
        self.finish(completed);
    }
}
