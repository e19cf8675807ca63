//! A TCP proxy between the store client and moto that does something to chosen connections:
//! answers an HTTP error without passing the request on, delays it, or cuts the request or
//! the response after some bytes. With the client's connection pool off
//! (`pool_max_idle_per_host=0`) a connection is one request, so the n-th connection is the
//! n-th request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Passes it on untouched.
    Pass,
    /// Reads the request's head and answers this status, never passing the request on.
    Status(u16),
    /// Waits, then passes it on.
    Delay(Duration),
    /// Passes on this many bytes of the request, then closes both sides.
    CutRequest(usize),
    /// Passes the request on, and this many bytes of the response, then closes both sides.
    CutResponse(usize),
}

/// The proxy: listening on a loopback port, each connection numbered from 0.
pub struct FaultProxy {
    pub port: u16,
    plan: Arc<Mutex<Vec<(usize, Fault)>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to `upstream_port` on the loopback, passing everything on.
    pub async fn start(upstream_port: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("its address").port();
        let plan: Arc<Mutex<Vec<(usize, Fault)>>> = Arc::default();
        let connections = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let plan = plan.clone();
            let connections = connections.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let n = connections.fetch_add(1, Ordering::SeqCst);
                    let fault = plan
                        .lock()
                        .expect("the plan")
                        .iter()
                        .find(|(at, _)| *at == n)
                        .map_or(Fault::Pass, |(_, fault)| *fault);
                    tokio::spawn(serve(client, upstream_port, fault));
                }
            }
        });
        FaultProxy {
            port,
            plan,
            connections,
            task,
        }
    }

    /// From now on: connection numbers count from 0 again, and `fault` hits connection `at`.
    pub fn plan(&self, faults: Vec<(usize, Fault)>) {
        *self.plan.lock().expect("the plan") = faults;
        self.connections.store(0, Ordering::SeqCst);
    }

    /// The connections since the last [`FaultProxy::plan`].
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut client: TcpStream, upstream_port: u16, fault: Fault) {
    match fault {
        Fault::Status(status) => {
            let _ = read_head(&mut client).await;
            let answer = format!(
                "HTTP/1.1 {status} Injected\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = client.write_all(answer.as_bytes()).await;
            let _ = client.shutdown().await;
            return;
        }
        Fault::Delay(delay) => tokio::time::sleep(delay).await,
        _ => {}
    }
    let Ok(upstream) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
        return;
    };
    let (request_limit, response_limit) = match fault {
        Fault::CutRequest(n) => (Some(n), None),
        Fault::CutResponse(n) => (None, Some(n)),
        _ => (None, None),
    };
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let mut requests = tokio::spawn(copy_limited(client_read, upstream_write, request_limit));
    let mut responses = tokio::spawn(copy_limited(upstream_read, client_write, response_limit));
    let request_ended_whole = tokio::select! {
        copied = &mut requests => matches!(copied, Ok(Ok(Copied::ToTheEnd))),
        _ = &mut responses => false,
    };
    if request_ended_whole {
        let _ = responses.await;
    } else {
        // A cut, or the response is over: dropping both halves closes both connections.
        requests.abort();
        responses.abort();
    }
}

/// How a copy ended.
enum Copied {
    /// The source closed.
    ToTheEnd,
    /// The limit was reached: the cut.
    Cut,
}

/// Reads the request head (to its blank line) so an injected answer follows a whole head.
async fn read_head(client: &mut TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// Copies until the source closes, or until `limit` bytes were copied (the cut). The cut comes
/// once bytes beyond the limit arrived, so a response cut at 0 bytes is one the server sent
/// (it handled the request) and the client never saw.
async fn copy_limited(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    limit: Option<usize>,
) -> std::io::Result<Copied> {
    let mut copied = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(Copied::ToTheEnd);
        }
        let passed = limit.map_or(n, |limit| n.min(limit - copied));
        to.write_all(&buf[..passed]).await?;
        copied += passed;
        if passed < n {
            return Ok(Copied::Cut);
        }
    }
}
