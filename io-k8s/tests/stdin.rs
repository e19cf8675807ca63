//! A command's standard input fed while it runs in a pod ([`SandboxWork::exec_with_input`]),
//! against the loopback API, whose exec runs the argv as a real process and forwards the
//! websocket's stdin channel to it, closing the process's input at the v5 protocol's close of
//! that channel (as the kubelet does). Pieces arrive in order, a close or a dropped sender ends
//! the input, a command that ends early answers the sender cleanly, and a timeout ends a
//! command whose input is open.
//!
//! [`SandboxWork::exec_with_input`]: sandkeeper_tokio::SandboxWork::exec_with_input

mod common;

use std::time::Duration;

use common::*;
use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_k8s::K8sBackend;
use sandkeeper_tokio::{CallGuard, Chunk, ExecOptions, Input, Keeper, KeeperConfig, OpError};
use tokio::sync::mpsc;

async fn keeper(server: &k8s_loopback::Loopback, owner: &str) -> Keeper<K8sBackend> {
    let backend = connect(server, claim_config(owner)).await;
    Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap()
}

async fn call(k: &Keeper<K8sBackend>) -> CallGuard<K8sBackend> {
    within(
        "acquire",
        k.acquire(CallSpec::new(
            CallId::new("c").unwrap(),
            SessionId::new("s").unwrap(),
        )),
    )
    .await
    .unwrap()
}

/// A bounded wait on a real process behind the loopback.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after 30 s"))
}

/// Drains a command's streamed output (so it never blocks on it), answering its standard
/// output as streamed.
fn drain(mut rx: mpsc::Receiver<Chunk>) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            if let Chunk::Stdout(b) = chunk {
                out.extend(b);
            }
        }
        out
    })
}

fn options(stdin: &[u8], timeout: Duration) -> ExecOptions {
    ExecOptions {
        stdin: stdin.to_vec(),
        timeout: Some(timeout),
        ..ExecOptions::default()
    }
}

/// `cat` echoes the up-front input, then each piece sent in order (one larger than kube's
/// stdin buffer and the pipe, so the writer is held back on the way), and ends with 0 at the
/// close; a send after the exec ended fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cat_echoes_pieces_in_order_and_ends_at_the_close() {
    let server = server().await;
    let k = keeper(&server, "stdin-echo").await;
    let g = call(&k).await;
    let (chunks, rx) = mpsc::channel(4);
    let streamed = drain(rx);
    let (input, from) = mpsc::channel(2);
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let sender = {
        let big = big.clone();
        async move {
            for piece in [b"one;".to_vec(), b"two;".to_vec(), big, b";three".to_vec()] {
                input.send(Input::Stdin(piece)).await.unwrap();
            }
            input.send(Input::Close).await.unwrap();
            input
        }
    };
    let work = g.work();
    let exec = work.exec_with_input(
        ["cat"],
        options(b"first;", Duration::from_secs(20)),
        chunks,
        from,
    );
    let (out, input) = within("cat", async { tokio::join!(exec, sender) }).await;
    let out = out.unwrap();
    let mut want = b"first;one;two;".to_vec();
    want.extend_from_slice(&big);
    want.extend_from_slice(b";three");
    assert_eq!(out.code, Some(0));
    assert!(out.stdout == want, "{} bytes echoed", out.stdout.len());
    assert!(streamed.await.unwrap() == want, "streamed");
    assert!(
        input.send(Input::Stdin(b"late".to_vec())).await.is_err(),
        "a send after the exec ended is refused"
    );
    g.release().await;
    k.close(Duration::from_secs(10)).await;
}

/// Dropping the sender closes the command's input: `cat` ends with what it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_sender_closes_the_input() {
    let server = server().await;
    let k = keeper(&server, "stdin-drop").await;
    let g = call(&k).await;
    let (chunks, rx) = mpsc::channel(4);
    let streamed = drain(rx);
    let (input, from) = mpsc::channel(2);
    let sender = async move {
        input
            .send(Input::Stdin(b"only this".to_vec()))
            .await
            .unwrap();
        drop(input);
    };
    let work = g.work();
    let exec = work.exec_with_input(["cat"], options(b"", Duration::from_secs(20)), chunks, from);
    let (out, ()) = within("cat", async { tokio::join!(exec, sender) }).await;
    let out = out.unwrap();
    assert_eq!(
        (out.code, out.stdout.as_slice()),
        (Some(0), &b"only this"[..])
    );
    assert_eq!(streamed.await.unwrap(), b"only this");
    g.release().await;
    k.close(Duration::from_secs(10)).await;
}

/// `head -c 5` ends after five bytes while the sender keeps sending: the exec answers its exit,
/// and the sender's sends fail once it ended, without a panic or a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ends_early_answers_the_sender_cleanly() {
    let server = server().await;
    let k = keeper(&server, "stdin-head").await;
    let g = call(&k).await;
    let (chunks, rx) = mpsc::channel(4);
    let streamed = drain(rx);
    let (input, from) = mpsc::channel(2);
    let sender = async move {
        // Until refused, for at most 10 s: past every buffer and pipe on the way.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            let piece = Input::Stdin(b"hello world, and more\n".repeat(200));
            if input.send(piece).await.is_err() {
                return true;
            }
        }
        false
    };
    let work = g.work();
    let exec = work.exec_with_input(
        ["head", "-c", "5"],
        options(b"", Duration::from_secs(20)),
        chunks,
        from,
    );
    let (out, refused) = within("head", async { tokio::join!(exec, sender) }).await;
    let out = out.unwrap();
    assert_eq!((out.code, out.stdout.as_slice()), (Some(0), &b"hello"[..]));
    assert!(refused, "sends still taken 10 s on");
    assert_eq!(streamed.await.unwrap(), b"hello");
    g.release().await;
    k.close(Duration::from_secs(10)).await;
}

/// A command reading an input that stays open is killed at its timeout (in the pod, by
/// `timeout -s KILL`); the sender then gets its sends refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_ends_a_command_whose_input_is_open() {
    let server = server().await;
    let k = keeper(&server, "stdin-timeout").await;
    let g = call(&k).await;
    let (chunks, rx) = mpsc::channel(4);
    let streamed = drain(rx);
    let (input, from) = mpsc::channel(2);
    input.send(Input::Stdin(b"waiting".to_vec())).await.unwrap();
    let work = g.work();
    let started = tokio::time::Instant::now();
    let exec = work.exec_with_input(["cat"], options(b"", Duration::from_secs(1)), chunks, from);
    let out = within("cat", exec).await;
    assert!(matches!(out, Err(OpError::Timeout { .. })), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "ended {:?} on",
        started.elapsed()
    );
    assert!(input.send(Input::Stdin(b"late".to_vec())).await.is_err());
    assert_eq!(streamed.await.unwrap(), b"waiting");
    g.release().await;
    k.close(Duration::from_secs(10)).await;
}
