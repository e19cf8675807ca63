//! `sandkeeper-init` on its own (issue 31): the frames it reads and writes, run directly on the
//! host without bubblewrap (it is then not a PID 1; what it adds as one is tested in
//! `containment.rs`). Several commands at once, each with its own output and exit; a program
//! that does not exist; a kill by id; a request it cannot decode ends it.
#![cfg(not(loom))]

#[path = "../src/local/wire.rs"]
#[allow(dead_code)]
mod wire;

use std::collections::HashMap;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use wire::{Reply, Request, Spawn};

/// The init, its standard output read on a thread into a channel of frames.
fn init() -> (Child, mpsc::Receiver<(u64, Reply)>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandkeeper-init"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(Some(body)) = wire::read_frame(&mut out, wire::MAX_REPLY) {
            if tx.send(wire::decode_reply(&body).unwrap()).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

fn send(child: &mut Child, id: u64, request: Request) {
    let frame = wire::encode_request(id, &request).unwrap();
    child.stdin.as_mut().unwrap().write_all(&frame).unwrap();
}

fn spawn(argv: &[&str], stdin: &[u8]) -> Request {
    Request::Spawn(Spawn {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
        stdin: stdin.to_vec(),
        window: 0,
        input: false,
    })
}

/// What came back for one id: stdout, stderr, and its last frame.
#[derive(Default, Debug)]
struct Seen {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    last: Option<Reply>,
}

/// Reads frames until each of `ids` got its last one (at most 20 s in all: a bounded wait on
/// a real process's answers).
fn until_done(rx: &mpsc::Receiver<(u64, Reply)>, ids: &[u64]) -> HashMap<u64, Seen> {
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    while ids
        .iter()
        .any(|id| seen.get(id).is_none_or(|s| s.last.is_none()))
    {
        let (id, reply) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the init answers");
        let s = seen.entry(id).or_default();
        assert!(s.last.is_none(), "a frame of {id} after its last");
        match reply {
            Reply::Stdout(b) => s.stdout.extend(b),
            Reply::Stderr(b) => s.stderr.extend(b),
            last => s.last = Some(last),
        }
    }
    seen
}

#[test]
fn commands_at_once_each_get_their_own_output_and_exit() {
    let (mut child, rx) = init();
    send(
        &mut child,
        1,
        spawn(&["sh", "-c", "echo out; echo err >&2; exit 3"], b""),
    );
    send(&mut child, 2, spawn(&["cat"], b"hello"));
    send(&mut child, 3, spawn(&["no-such-program-here"], b""));
    send(&mut child, 4, spawn(&["sleep", "100"], b""));
    send(&mut child, 4, Request::Kill);
    let seen = until_done(&rx, &[1, 2, 3, 4]);
    let exit = |id: u64| match &seen[&id].last {
        Some(Reply::Exit(e)) => *e,
        other => panic!("{id}: {other:?}"),
    };
    assert_eq!(exit(1).code, Some(3));
    assert_eq!(seen[&1].stdout, b"out\n");
    assert_eq!(seen[&1].stderr, b"err\n");
    assert_eq!(exit(2).code, Some(0));
    assert_eq!(seen[&2].stdout, b"hello");
    assert!(matches!(&seen[&3].last, Some(Reply::Failed(_))), "{seen:?}");
    assert_eq!(exit(4).signal, Some(9));
    assert!(!exit(4).escaped);
    drop(child.stdin.take());
    assert!(
        child.wait().unwrap().success(),
        "it ends when its input does"
    );
}

#[test]
fn a_frame_it_cannot_decode_ends_it() {
    let (mut child, _rx) = init();
    let stdin = child.stdin.as_mut().unwrap();
    stdin
        .write_all(&[9, 0, 0, 0, 42, 0, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    drop(child.stdin.take());
    assert!(!child.wait().unwrap().success());
}

#[test]
fn output_past_its_window_waits_for_the_keepers_credit() {
    let (mut child, rx) = init();
    let Request::Spawn(mut s) = spawn(&["head", "-c", "1000000", "/dev/zero"], b"") else {
        unreachable!()
    };
    s.window = 64 << 10;
    send(&mut child, 1, Request::Spawn(s));
    // Takes what comes without credit. A bounded wait on a real process: half a second
    // without a frame means the init holds the rest back.
    let mut early = 0;
    let mut ended = false;
    while let Ok((_, reply)) = rx.recv_timeout(Duration::from_millis(500)) {
        match reply {
            Reply::Stdout(b) => early += b.len(),
            _ => ended = true,
        }
    }
    assert!(!ended, "it ended without credit");
    assert!(
        early > 0 && early <= 2 * (64 << 10),
        "{early} bytes before any credit"
    );
    send(&mut child, 1, Request::Credit(1 << 30));
    let seen = until_done(&rx, &[1]);
    assert_eq!(early + seen[&1].stdout.len(), 1_000_000);
    assert!(matches!(seen[&1].last, Some(Reply::Exit(e)) if e.code == Some(0)));
}
