//! A command's standard input fed while it runs ([`SandboxWork::exec_with_input`]), on the
//! local backend in each way it runs commands: process groups only, one bubblewrap per command,
//! and through the sandbox's init (one bubblewrap per sandbox, `sandkeeper-init`; skipped,
//! saying why, where bubblewrap or the init does not work here). Pieces arrive in order, a
//! close or a dropped sender ends the input, a command that stops reading or ends answers the
//! sender cleanly, a timeout ends a command whose input is open, and (through the init) a
//! command that does not read holds up no other command.
//!
//! [`SandboxWork::exec_with_input`]: sandkeeper_tokio::SandboxWork::exec_with_input
#![cfg(not(loom))]

use std::path::PathBuf;
use std::time::Duration;

use sandkeeper::{CallId, CallSpec, Config, SessionId};
use sandkeeper_tokio::local::{Isolation, LocalConfig, Namespaces};
use sandkeeper_tokio::{
    CallGuard, Chunk, ExecOptions, ExecOutput, Input, Keeper, KeeperConfig, LocalBackend, OpError,
};
use tokio::sync::mpsc;

/// The ways the local backend runs a command.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// Process groups only (no bubblewrap).
    Groups,
    /// One bubblewrap per command (process groups where bubblewrap does not work here).
    PerCommand,
    /// Through the sandbox's init.
    Init,
}

const WAYS: [Way; 3] = [Way::Groups, Way::PerCommand, Way::Init];

/// A keeper running commands the way asked, or `None` (saying why) for the init where it does
/// not work here.
fn keeper(name: &str, way: Way) -> Option<Keeper<LocalBackend>> {
    let root: PathBuf = std::env::temp_dir().join(format!(
        "sandkeeper-stdin-{name}-{way:?}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&root);
    let (isolation, namespaces) = match way {
        Way::Groups => (Isolation::Off, Namespaces::PerSandbox),
        Way::PerCommand => (Isolation::Auto, Namespaces::PerCommand),
        Way::Init => (Isolation::Auto, Namespaces::PerSandbox),
    };
    let config = LocalConfig {
        isolation,
        namespaces,
        ..LocalConfig::new(root)
    };
    let backend = LocalBackend::new(config).unwrap();
    let k = Keeper::new(KeeperConfig::with_core(Config::default()), backend).unwrap();
    let through_init = k.backend().isolation().init().is_some();
    if matches!(way, Way::Init) != through_init {
        eprintln!("skipped {way:?}: {}", k.backend().isolation());
        return None;
    }
    Some(k)
}

async fn call(k: &Keeper<LocalBackend>) -> CallGuard<LocalBackend> {
    k.acquire(CallSpec::new(
        CallId::new("c").unwrap(),
        SessionId::new("s").unwrap(),
    ))
    .await
    .unwrap()
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

/// A bounded wait on a real process.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after 30 s"))
}

fn options(stdin: &[u8], timeout: Duration) -> ExecOptions {
    ExecOptions {
        stdin: stdin.to_vec(),
        timeout: Some(timeout),
        ..ExecOptions::default()
    }
}

/// `cat` echoes the up-front input and then each piece sent, in order — one piece larger
/// than the init's window and its frames — and ends with 0 at the close; what is sent after
/// the close never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cat_echoes_pieces_in_order_and_ends_at_the_close() {
    for way in WAYS {
        let Some(k) = keeper("echo", way) else {
            continue;
        };
        let g = call(&k).await;
        let (chunks, rx) = mpsc::channel(4);
        let streamed = drain(rx);
        let (input, from) = mpsc::channel(2);
        let big: Vec<u8> = (0..600_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut want = b"first;".to_vec();
        let sender = {
            let big = big.clone();
            async move {
                for piece in [b"one;".to_vec(), b"two;".to_vec(), big, b";three".to_vec()] {
                    input.send(Input::Stdin(piece)).await.unwrap();
                }
                input.send(Input::Close).await.unwrap();
                // After the close: dropped, or refused once the exec ended.
                let _ = input.send(Input::Stdin(b"late".to_vec())).await;
            }
        };
        let work = g.work();
        let exec = work.exec_with_input(
            ["cat"],
            options(b"first;", Duration::from_secs(30)),
            chunks,
            from,
        );
        let (out, ()) = within("cat", async { tokio::join!(exec, sender) }).await;
        let out = out.unwrap_or_else(|e| panic!("{way:?}: {e}"));
        want.extend_from_slice(b"one;two;");
        want.extend_from_slice(&big);
        want.extend_from_slice(b";three");
        assert_eq!(out.code, Some(0), "{way:?}");
        assert!(out.stdout == want, "{way:?}: {} bytes", out.stdout.len());
        assert!(streamed.await.unwrap() == want, "{way:?}: streamed");
        g.release().await;
    }
}

/// `head -c 5` ends after five bytes while the sender keeps sending: the exec answers its
/// exit, and the sender's sends fail once it ended, without a panic or a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ends_early_answers_the_sender_cleanly() {
    for way in WAYS {
        let Some(k) = keeper("head", way) else {
            continue;
        };
        let g = call(&k).await;
        let (chunks, rx) = mpsc::channel(4);
        let streamed = drain(rx);
        let (input, from) = mpsc::channel(2);
        let sender = async move {
            // Until refused, for at most 10 s: past every pipe and window on the way.
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
            options(b"", Duration::from_secs(30)),
            chunks,
            from,
        );
        let (out, refused) = within("head", async { tokio::join!(exec, sender) }).await;
        let out = out.unwrap_or_else(|e| panic!("{way:?}: {e}"));
        assert_eq!(
            (out.code, out.stdout.as_slice()),
            (Some(0), &b"hello"[..]),
            "{way:?}"
        );
        assert!(refused, "{way:?}: sends still taken 10 s on");
        assert_eq!(streamed.await.unwrap(), b"hello", "{way:?}");
        g.release().await;
    }
}

/// Dropping the sender closes the command's input: `cat` ends with what it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_sender_closes_the_input() {
    for way in WAYS {
        let Some(k) = keeper("drop", way) else {
            continue;
        };
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
        let exec =
            work.exec_with_input(["cat"], options(b"", Duration::from_secs(30)), chunks, from);
        let (out, ()) = within("cat", async { tokio::join!(exec, sender) }).await;
        let out = out.unwrap_or_else(|e| panic!("{way:?}: {e}"));
        assert_eq!(
            (out.code, out.stdout.as_slice()),
            (Some(0), &b"only this"[..]),
            "{way:?}"
        );
        assert_eq!(streamed.await.unwrap(), b"only this", "{way:?}");
        g.release().await;
    }
}

/// A command reading an input that stays open is killed at its timeout; the sender then gets
/// its sends refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_ends_a_command_whose_input_is_open() {
    for way in WAYS {
        let Some(k) = keeper("timeout", way) else {
            continue;
        };
        let g = call(&k).await;
        let (chunks, rx) = mpsc::channel(4);
        let streamed = drain(rx);
        let (input, from) = mpsc::channel(2);
        input.send(Input::Stdin(b"waiting".to_vec())).await.unwrap();
        let work = g.work();
        let exec = work.exec_with_input(
            ["cat"],
            options(b"", Duration::from_millis(700)),
            chunks,
            from,
        );
        let out: Result<ExecOutput, OpError> = within("cat", exec).await;
        assert!(
            matches!(out, Err(OpError::Timeout { .. })),
            "{way:?}: {out:?}"
        );
        assert!(input.send(Input::Stdin(b"late".to_vec())).await.is_err());
        assert_eq!(streamed.await.unwrap(), b"waiting", "{way:?}");
        g.release().await;
    }
}

/// Through the init, a command that never reads its input, sent more than every buffer on the
/// way holds, blocks its sender only (bounded: what it took is what the way holds): another
/// command of the sandbox runs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_does_not_read_holds_up_no_other() {
    let Some(k) = keeper("stuck", Way::Init) else {
        return;
    };
    let g = call(&k).await;
    let (chunks, rx) = mpsc::channel(4);
    let _streamed = drain(rx);
    let (input, from) = mpsc::channel(2);
    // Pieces taken before the command ended and the rest was refused.
    let sender = tokio::spawn(async move {
        for sent in 0..64 {
            let piece = Input::Stdin(vec![b'x'; 64 << 10]);
            if input.send(piece).await.is_err() {
                return sent;
            }
        }
        64
    });
    let work = g.work();
    let stuck = work.exec_with_input(
        ["sleep", "3"],
        options(b"", Duration::from_secs(30)),
        chunks,
        from,
    );
    let other = async {
        // Once the stuck command's input is at its window.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = tokio::time::Instant::now();
        let out = work.exec(["echo", "hi"], ExecOptions::default()).await;
        (out, started.elapsed())
    };
    let (stuck, (other, took)) = within("sleep", async { tokio::join!(stuck, other) }).await;
    assert_eq!(other.unwrap().stdout, b"hi\n");
    assert!(
        took < Duration::from_secs(2),
        "the other command took {took:?}"
    );
    assert_eq!(stuck.unwrap().code, Some(0));
    // Its input was taken up to what the way holds (the channel, the init's window, the
    // pipe), then held back, then refused at its end.
    let sent = within("sender", sender).await.unwrap();
    assert!((4..64).contains(&sent), "{sent} pieces of 64 KiB taken");
    g.release().await;
}
