//! The frames between the keeper and a sandbox's init (`sandkeeper-init`, `src/bin`): what the
//! keeper asks (run a command, feed its standard input, kill one) and what the init answers
//! (output, input taken, an exit, a failed start), each tagged with the id of the command it is about, so that one pair of pipes carries
//! every command of the sandbox at once.
//!
//! Std only: the init includes this file as a module of its own (`#[path]`), without the rest of
//! the crate. A frame is `length: u32 LE`, then `tag: u8`, `id: u64 LE` and the tag's fields;
//! byte strings are `length: u32 LE` and the bytes, lists a `u32 LE` count and their items.
//! Decoding never panics: a short, long or malformed frame is a [`WireError`].

use std::io::{self, Read};

/// The largest request frame the init accepts (a command's standard input travels in one).
pub const MAX_FRAME: usize = 1 << 30;

/// The most bytes of a command's standard input one [`Request::Input`] carries (a longer one
/// does not decode): the keeper cuts what it is given into pieces of at most this.
pub const MAX_INPUT: usize = 64 << 10;

/// The largest reply frame the keeper accepts: the init sends output in pieces of 64 KiB, so a
/// longer frame is not the init's, and allocates nothing.
pub const MAX_REPLY: usize = 1 << 20;

/// What the keeper asks the init.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Run a command (its id is the frame's).
    Spawn(Spawn),
    /// Kill the command's process group.
    Kill,
    /// The keeper took this many more bytes of the command's output (see [`Spawn::window`]).
    Credit(u64),
    /// More of the command's standard input (one it spawned with [`Spawn::input`]), at most
    /// [`MAX_INPUT`] bytes, written after what came before; the init answers
    /// [`Reply::Taken`] once it is written (or dropped: the command no longer reads).
    Input(Vec<u8>),
    /// Closes the command's standard input once what came before is written.
    CloseInput,
}

/// A command to run: exactly this argv, environment, working directory and standard input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spawn {
    /// The program and its arguments (the program looked up on the environment's `PATH`).
    pub argv: Vec<String>,
    /// Every variable the command gets; nothing else.
    pub env: Vec<(String, String)>,
    /// Its working directory (a path inside the sandbox).
    pub cwd: String,
    /// Its standard input (closed at once when empty, unless [`Spawn::input`]).
    pub stdin: Vec<u8>,
    /// How many bytes of its output the init may send before the keeper's [`Request::Credit`]
    /// (0: no bound): the init stops reading its pipes, and the command blocks on them, while
    /// the keeper's reader of its output is behind by that much.
    pub window: u64,
    /// Whether its standard input stays open after `stdin`, for [`Request::Input`] frames,
    /// until [`Request::CloseInput`] (or the command's end). The init writes it from a thread
    /// of the command's own, so a command that does not read holds up nothing else.
    pub input: bool,
}

/// What the init answers about a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A piece of its standard output.
    Stdout(Vec<u8>),
    /// A piece of its standard error.
    Stderr(Vec<u8>),
    /// It ended; the last frame of its id.
    Exit(Exit),
    /// It could not be started (why); the last frame of its id.
    Failed(String),
    /// This many bytes of its [`Request::Input`] were written to it, or dropped once it no
    /// longer read: the keeper sends no more than a window ahead of these.
    Taken(u64),
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Whether its output stayed open after its process group was killed (a process of it left
    /// the group and still holds the pipes; it lives on in the sandbox until the sandbox stops).
    pub escaped: bool,
}

/// A frame that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// It ended before a field did.
    Short,
    /// An unknown tag.
    Tag(u8),
    /// A flag that is neither 0 nor 1.
    Flag(u8),
    /// A string that is not UTF-8.
    NotUtf8,
    /// Bytes left after its last field.
    Trailing,
    /// Longer than [`MAX_FRAME`].
    TooLong(usize),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Short => write!(f, "a frame ends early"),
            WireError::Tag(t) => write!(f, "unknown frame tag {t}"),
            WireError::Flag(b) => write!(f, "a flag of {b}, neither 0 nor 1"),
            WireError::NotUtf8 => write!(f, "a string of a frame is not UTF-8"),
            WireError::Trailing => write!(f, "bytes after a frame's last field"),
            WireError::TooLong(n) => write!(f, "a frame or field of {n} bytes, too long"),
        }
    }
}

impl std::error::Error for WireError {}

const SPAWN: u8 = 1;
const KILL: u8 = 2;
const CREDIT: u8 = 3;
const INPUT: u8 = 4;
const CLOSE_INPUT: u8 = 5;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const EXIT: u8 = 3;
const FAILED: u8 = 4;
const TAKEN: u8 = 5;

/// A frame being written: the length is filled in by [`Out::done`].
struct Out(Vec<u8>);

impl Out {
    fn new(tag: u8, id: u64) -> Self {
        let mut b = vec![0; 4];
        b.push(tag);
        b.extend_from_slice(&id.to_le_bytes());
        Out(b)
    }

    fn u32(&mut self, n: u32) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }

    fn bytes(&mut self, b: &[u8]) -> Result<(), WireError> {
        let n = u32::try_from(b.len()).map_err(|_| WireError::TooLong(b.len()))?;
        self.u32(n);
        self.0.extend_from_slice(b);
        Ok(())
    }

    fn count(&mut self, n: usize) -> Result<(), WireError> {
        self.u32(u32::try_from(n).map_err(|_| WireError::TooLong(n))?);
        Ok(())
    }

    fn done(mut self) -> Result<Vec<u8>, WireError> {
        let body = self.0.len() - 4;
        if body > MAX_FRAME {
            return Err(WireError::TooLong(body));
        }
        self.0[..4].copy_from_slice(&(body as u32).to_le_bytes());
        Ok(self.0)
    }
}

/// A frame's body being read.
struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }

    /// A byte string of at most `max` bytes.
    fn bytes_at_most(&mut self, max: usize) -> Result<Vec<u8>, WireError> {
        let b = self.bytes()?;
        if b.len() > max {
            return Err(WireError::TooLong(b.len()));
        }
        Ok(b)
    }

    fn flag(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(WireError::Flag(b)),
        }
    }

    fn string(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?).map_err(|_| WireError::NotUtf8)
    }

    /// A count of items, each at least `least` bytes: never more than the bytes left allow
    /// (a forged count cannot make a large allocation).
    fn count(&mut self, least: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(least) > self.0.len() {
            return Err(WireError::Short);
        }
        Ok(n)
    }

    fn end(self) -> Result<(), WireError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing)
        }
    }
}

/// The frame of `request` about command `id`, length included.
pub fn encode_request(id: u64, request: &Request) -> Result<Vec<u8>, WireError> {
    match request {
        Request::Kill => Out::new(KILL, id).done(),
        Request::CloseInput => Out::new(CLOSE_INPUT, id).done(),
        Request::Input(b) => {
            if b.len() > MAX_INPUT {
                return Err(WireError::TooLong(b.len()));
            }
            let mut o = Out::new(INPUT, id);
            o.bytes(b)?;
            o.done()
        }
        Request::Credit(n) => {
            let mut o = Out::new(CREDIT, id);
            o.0.extend_from_slice(&n.to_le_bytes());
            o.done()
        }
        Request::Spawn(s) => {
            let mut o = Out::new(SPAWN, id);
            o.count(s.argv.len())?;
            for a in &s.argv {
                o.bytes(a.as_bytes())?;
            }
            o.count(s.env.len())?;
            for (k, v) in &s.env {
                o.bytes(k.as_bytes())?;
                o.bytes(v.as_bytes())?;
            }
            o.bytes(s.cwd.as_bytes())?;
            o.bytes(&s.stdin)?;
            o.0.extend_from_slice(&s.window.to_le_bytes());
            o.0.push(u8::from(s.input));
            o.done()
        }
    }
}

/// A request frame's body (without its length): its command's id and the request.
pub fn decode_request(body: &[u8]) -> Result<(u64, Request), WireError> {
    let mut i = In(body);
    let tag = i.u8()?;
    let id = i.u64()?;
    let request = match tag {
        KILL => Request::Kill,
        CREDIT => Request::Credit(i.u64()?),
        INPUT => Request::Input(i.bytes_at_most(MAX_INPUT)?),
        CLOSE_INPUT => Request::CloseInput,
        SPAWN => {
            let mut s = Spawn::default();
            for _ in 0..i.count(4)? {
                s.argv.push(i.string()?);
            }
            for _ in 0..i.count(8)? {
                s.env.push((i.string()?, i.string()?));
            }
            s.cwd = i.string()?;
            s.stdin = i.bytes()?;
            s.window = i.u64()?;
            s.input = i.flag()?;
            Request::Spawn(s)
        }
        t => return Err(WireError::Tag(t)),
    };
    i.end()?;
    Ok((id, request))
}

/// The frame of `reply` about command `id`, length included.
pub fn encode_reply(id: u64, reply: &Reply) -> Result<Vec<u8>, WireError> {
    let mut o;
    match reply {
        Reply::Stdout(b) => {
            o = Out::new(STDOUT, id);
            o.bytes(b)?;
        }
        Reply::Stderr(b) => {
            o = Out::new(STDERR, id);
            o.bytes(b)?;
        }
        Reply::Failed(why) => {
            o = Out::new(FAILED, id);
            o.bytes(why.as_bytes())?;
        }
        Reply::Taken(n) => {
            o = Out::new(TAKEN, id);
            o.0.extend_from_slice(&n.to_le_bytes());
        }
        Reply::Exit(e) => {
            o = Out::new(EXIT, id);
            for (has, n) in [(e.code.is_some(), e.code), (e.signal.is_some(), e.signal)] {
                o.0.push(u8::from(has));
                o.0.extend_from_slice(&n.unwrap_or(0).to_le_bytes());
            }
            o.0.push(u8::from(e.escaped));
        }
    }
    o.done()
}

/// A reply frame's body (without its length): its command's id and the reply.
pub fn decode_reply(body: &[u8]) -> Result<(u64, Reply), WireError> {
    let mut i = In(body);
    let tag = i.u8()?;
    let id = i.u64()?;
    let reply = match tag {
        STDOUT => Reply::Stdout(i.bytes()?),
        STDERR => Reply::Stderr(i.bytes()?),
        FAILED => Reply::Failed(i.string()?),
        TAKEN => Reply::Taken(i.u64()?),
        EXIT => {
            let code = (i.u8()? != 0, i.u32()? as i32);
            let signal = (i.u8()? != 0, i.u32()? as i32);
            Reply::Exit(Exit {
                code: code.0.then_some(code.1),
                signal: signal.0.then_some(signal.1),
                escaped: i.u8()? != 0,
            })
        }
        t => return Err(WireError::Tag(t)),
    };
    i.end()?;
    Ok((id, reply))
}

/// The length of a frame from its first four bytes, checked against `max` ([`MAX_FRAME`] for
/// requests, [`MAX_REPLY`] for replies).
pub fn frame_len(head: [u8; 4], max: usize) -> Result<usize, WireError> {
    let n = u32::from_le_bytes(head) as usize;
    if n > max {
        return Err(WireError::TooLong(n));
    }
    Ok(n)
}

/// Reads one frame's body of at most `max` bytes from `r`; `None` at a clean end (nothing of a
/// next frame read).
pub fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut head = [0; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let n = frame_len(head, max).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut body = vec![0; n];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        &frame[4..]
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let spawn = Request::Spawn(Spawn {
            argv: vec!["sh".into(), "-c".into(), "echo ü".into()],
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: "/w".into(),
            stdin: b"in\0put".to_vec(),
            window: 1 << 20,
            input: true,
        });
        let requests = [
            spawn,
            Request::Kill,
            Request::Credit(65536),
            Request::Input(b"more\0input".to_vec()),
            Request::Input(vec![7; MAX_INPUT]),
            Request::Input(Vec::new()),
            Request::CloseInput,
        ];
        for r in requests {
            let f = encode_request(7, &r).unwrap();
            assert_eq!(decode_request(body(&f)), Ok((7, r)));
        }
        let exit = Reply::Exit(Exit {
            code: None,
            signal: Some(9),
            escaped: true,
        });
        for r in [
            Reply::Stdout(b"out".to_vec()),
            Reply::Stderr(Vec::new()),
            Reply::Failed("no such file".into()),
            Reply::Taken(u64::MAX),
            exit,
        ] {
            let f = encode_reply(u64::MAX, &r).unwrap();
            assert_eq!(decode_reply(body(&f)), Ok((u64::MAX, r)));
        }
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let f = encode_request(1, &Request::Spawn(Spawn::default())).unwrap();
        for cut in 0..f.len() - 4 {
            assert!(decode_request(&body(&f)[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = f.clone();
        long.push(0);
        assert_eq!(decode_request(body(&long)), Err(WireError::Trailing));
        assert_eq!(
            decode_request(&[9, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(WireError::Tag(9))
        );
        // A forged count of a billion arguments in a short frame.
        let mut forged = vec![SPAWN];
        forged.extend_from_slice(&1u64.to_le_bytes());
        forged.extend_from_slice(&1_000_000_000u32.to_le_bytes());
        assert_eq!(decode_request(&forged), Err(WireError::Short));
        assert!(frame_len(u32::MAX.to_le_bytes(), MAX_FRAME).is_err());
        assert!(frame_len((MAX_REPLY as u32 + 1).to_le_bytes(), MAX_REPLY).is_err());
        let mut r: &[u8] = &[1, 0];
        assert!(read_frame(&mut r, MAX_FRAME).is_err());
        let mut empty: &[u8] = &[];
        assert!(read_frame(&mut empty, MAX_FRAME).unwrap().is_none());
    }

    #[test]
    fn bad_input_frames_are_errors_not_panics() {
        // An input frame cut anywhere, or with a byte past its end.
        let f = encode_request(3, &Request::Input(b"abc".to_vec())).unwrap();
        for cut in 0..f.len() - 4 {
            assert!(decode_request(&body(&f)[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = f.clone();
        long.push(0);
        assert_eq!(decode_request(body(&long)), Err(WireError::Trailing));
        let close = encode_request(3, &Request::CloseInput).unwrap();
        let mut long = close.clone();
        long.push(1);
        assert_eq!(decode_request(body(&long)), Err(WireError::Trailing));
        // More than a piece's worth: refused at both ends, never allocated by a forged length.
        let big = Request::Input(vec![0; MAX_INPUT + 1]);
        assert_eq!(
            encode_request(3, &big),
            Err(WireError::TooLong(MAX_INPUT + 1))
        );
        let mut forged = vec![INPUT];
        forged.extend_from_slice(&3u64.to_le_bytes());
        forged.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_request(&forged), Err(WireError::Short));
        let mut over = vec![INPUT];
        over.extend_from_slice(&3u64.to_le_bytes());
        over.extend_from_slice(&(MAX_INPUT as u32 + 1).to_le_bytes());
        over.extend(std::iter::repeat_n(0, MAX_INPUT + 1));
        assert_eq!(
            decode_request(&over),
            Err(WireError::TooLong(MAX_INPUT + 1))
        );
        // A spawn whose input flag is neither 0 nor 1.
        let mut spawn = encode_request(1, &Request::Spawn(Spawn::default())).unwrap();
        *spawn.last_mut().unwrap() = 2;
        assert_eq!(decode_request(body(&spawn)), Err(WireError::Flag(2)));
        // A taken reply cut short.
        let taken = encode_reply(1, &Reply::Taken(5)).unwrap();
        for cut in 0..taken.len() - 4 {
            assert!(decode_reply(&body(&taken)[..cut]).is_err(), "cut at {cut}");
        }
    }
}
