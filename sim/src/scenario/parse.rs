//! The scenario parser: text to [`Scenario`], with line-numbered errors.

use std::time::Duration;

use sandkeeper::{
    CallId, Config, ExternalId, Key, PathName, ReleasePolicy, SameKey, Scope, SessionId, Snapshot,
    SuspendHookFailure, Tiers, UserId, WayDown,
};

use crate::step::fleet::FleetSpec;
use crate::step::{fmt_duration, Answer, Expect, ResolveExpect, Step};

/// Error and reason kinds a scenario may name (kebab case).
pub const KINDS: [&str; 25] = [
    "closed",
    "unknown-call",
    "duplicate-call",
    "already-released",
    "invalid-name",
    "no-active-sandbox",
    "sandbox-gone",
    "wait-timeout",
    "queue-full",
    "start-failed",
    "start-timeout",
    "hook-failed",
    "drain-deadline",
    "no-sandbox",
    "superseded",
    "upload-failed",
    "upload-timeout",
    "not-held",
    "not-entered",
    "unknown-sandbox",
    "unknown-upload",
    "missing-user",
    "limit-exceeded",
    "key-in-use",
    "fenced",
];

/// A malformed scenario: the line (1-based) and what was expected there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// The line, 1-based.
    pub line: usize,
    /// What is wrong and what was expected.
    pub message: String,
}

/// A parsed scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The core's configuration.
    pub config: Config,
    /// The deadline of a `close` without `deadline=`.
    pub close_deadline: Duration,
    /// The steps, each with its line number.
    pub steps: Vec<(usize, Step)>,
    /// A fleet scenario's `fleet` line (its lease timing is `config.fleet`); `None` for one
    /// process.
    pub fleet: Option<FleetSpec>,
}

/// One line's words, read left to right.
pub(super) struct Line<'a> {
    /// The line number, 1-based.
    pub(super) no: usize,
    /// Its words, the verb first.
    pub(super) words: Vec<&'a str>,
    /// The next word to read.
    pub(super) pos: usize,
}

impl<'a> Line<'a> {
    pub(super) fn err<T>(&self, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError {
            line: self.no,
            message: message.into(),
        })
    }

    pub(super) fn positional(&mut self, what: &str) -> Result<&'a str, ParseError> {
        match self.words.get(self.pos) {
            Some(w) if !w.contains('=') => {
                self.pos += 1;
                Ok(w)
            }
            Some(w) => self.err(format!("expected {what}, found `{w}`")),
            None => self.err(format!("expected {what} after `{}`", self.words.join(" "))),
        }
    }

    pub(super) fn optional_positional(&mut self) -> Option<&'a str> {
        match self.words.get(self.pos) {
            Some(w) if !w.contains('=') => {
                self.pos += 1;
                Some(w)
            }
            _ => None,
        }
    }

    /// The remaining `key=value` words, each key allowed once and only from `allowed`.
    pub(super) fn keys(&mut self, allowed: &[&str]) -> Result<Vec<(&'a str, &'a str)>, ParseError> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        while let Some(w) = self.words.get(self.pos) {
            self.pos += 1;
            let Some((k, v)) = w.split_once('=') else {
                return self.err(format!(
                    "unexpected word `{w}`; expected key=value with a key among: {}",
                    allowed.join(", ")
                ));
            };
            if !allowed.contains(&k) {
                return self.err(format!(
                    "unknown key `{k}`; expected one of: {}",
                    allowed.join(", ")
                ));
            }
            if out.iter().any(|(o, _)| *o == k) {
                return self.err(format!("key `{k}` given twice"));
            }
            if v.is_empty() {
                return self.err(format!("key `{k}` has no value"));
            }
            out.push((k, v));
        }
        Ok(out)
    }

    pub(super) fn done(&self) -> Result<(), ParseError> {
        match self.words.get(self.pos) {
            None => Ok(()),
            Some(w) => self.err(format!("unexpected word `{w}` at the end of the line")),
        }
    }
}

pub(super) fn get<'a>(keys: &[(&'a str, &'a str)], k: &str) -> Option<&'a str> {
    keys.iter().find(|(key, _)| *key == k).map(|(_, v)| *v)
}

pub(super) fn check_name(line: &Line, what: &str, text: &str) -> Result<(), ParseError> {
    if text.is_empty()
        || !text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return line.err(format!(
            "invalid {what} name `{text}`: expected [A-Za-z0-9_.-]+"
        ));
    }
    Ok(())
}

macro_rules! named {
    ($fn:ident, $ty:ty, $what:literal) => {
        pub(super) fn $fn(line: &Line, text: &str) -> Result<$ty, ParseError> {
            check_name(line, $what, text)?;
            <$ty>::new(text).or_else(|e| line.err(format!("invalid {} name: {}", $what, e.why)))
        }
    };
}

named!(call_name, CallId, "call");
named!(session_name, SessionId, "session");
named!(user_name, UserId, "user");
named!(external_name, ExternalId, "external");
named!(path_name, PathName, "path");

/// A key as it is displayed: `session:<s>`, `user:<u>`, `call:<c>`, `external:<e>`, `agent`,
/// `global`.
pub(super) fn key_name(line: &Line, text: &str) -> Result<Key, ParseError> {
    Ok(match text.split_once(':') {
        None if text == "agent" => Key::Agent,
        None if text == "global" => Key::Global,
        Some(("session", s)) => Key::Session(session_name(line, s)?),
        Some(("user", u)) => Key::User(user_name(line, u)?),
        Some(("call", c)) => Key::Call(call_name(line, c)?),
        Some(("external", e)) => Key::External(external_name(line, e)?),
        _ => {
            return line.err(format!(
                "invalid key `{text}`: expected session:<s>, user:<u>, call:<c>, external:<e>, agent or global"
            ))
        }
    })
}

pub(super) fn at_call(line: &Line, text: &str) -> Result<CallId, ParseError> {
    match text.strip_prefix('@') {
        Some(c) => call_name(line, c),
        None => line.err(format!("expected @<call>, found `{text}`")),
    }
}

pub(super) fn duration(line: &Line, text: &str) -> Result<Duration, ParseError> {
    let (digits, unit) = if let Some(d) = text.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = text.strip_suffix('s') {
        (d, 1000)
    } else {
        return line.err(format!(
            "invalid duration `{text}`: expected an integer with ms or s (250ms, 5s)"
        ));
    };
    match digits.parse::<u64>() {
        Ok(n) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            match n.checked_mul(unit) {
                Some(ms) => Ok(Duration::from_millis(ms)),
                None => line.err(format!("duration `{text}` is too long")),
            }
        }
        _ => line.err(format!(
            "invalid duration `{text}`: expected an integer with ms or s (250ms, 5s)"
        )),
    }
}

pub(super) fn number(line: &Line, key: &str, text: &str) -> Result<u64, ParseError> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return line.err(format!(
            "`{key}` expects a non-negative integer, found `{text}`"
        ));
    }
    text.parse::<u64>().or_else(|_| {
        line.err(format!(
            "`{key}` expects a non-negative integer, found `{text}`"
        ))
    })
}

fn kind(line: &Line, text: &str) -> Result<String, ParseError> {
    if KINDS.contains(&text) {
        Ok(text.to_string())
    } else {
        line.err(format!(
            "unknown kind `{text}`; expected one of: {}",
            KINDS.join(", ")
        ))
    }
}

/// Parses a scenario file's text.
pub fn parse(text: &str) -> Result<Scenario, ParseError> {
    let mut config = Config::default();
    let mut close_deadline = Duration::from_secs(10);
    let mut steps = Vec::new();
    let mut seen_config_keys: Vec<String> = Vec::new();
    let mut fleet: Option<FleetSpec> = None;
    for (i, raw) in text.lines().enumerate() {
        let no = i + 1;
        let content = raw.split('#').next().unwrap_or("");
        let words: Vec<&str> = content.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let mut line = Line { no, words, pos: 1 };
        let verb = line.words[0];
        if verb == "fleet" {
            if !steps.is_empty() {
                return line.err("`fleet` must come before the first step");
            }
            if fleet.is_some() {
                return line.err("`fleet` given twice");
            }
            fleet = Some(super::fleet::fleet_line(&mut line, &mut config)?);
            continue;
        }
        if verb.starts_with('[') {
            let Some(spec) = &fleet else {
                return line.err(format!(
                    "`{verb}` names a replica, but there is no fleet: a `fleet replicas=<n>` line must come before the first step"
                ));
            };
            let step = super::fleet::on_replica(&line, spec)?;
            steps.push((no, step));
            continue;
        }
        if verb == "config" {
            if !steps.is_empty() {
                return line.err("`config` must come before the first step");
            }
            let keys = line.keys(&[
                "scope",
                "same-key",
                "release",
                "drain",
                "start-timeout",
                "upload-timeout",
                "wait-timeout",
                "max-waiters",
                "close-deadline",
                "command-timeout",
                "close-grace",
                "upload-retries",
                "retry-backoff",
                "hook-after-start",
                "hook-after-resume",
                "hook-before-suspend",
                "hook-before-stop",
                "hook-suspend-failure",
            ])?;
            for (k, v) in keys {
                if seen_config_keys.iter().any(|s| s == k) {
                    return line.err(format!("config key `{k}` given twice"));
                }
                seen_config_keys.push(k.to_string());
                match k {
                    "scope" => {
                        config.scope = match v {
                            "call" => Scope::Call,
                            "session" => Scope::Session,
                            "user" => Scope::User,
                            "agent" => Scope::Agent,
                            "global" => Scope::Global,
                            _ => {
                                return line.err(format!(
                                    "invalid scope `{v}`: expected call, session, user, agent or global"
                                ))
                            }
                        }
                    }
                    "same-key" => {
                        config.same_key = match v {
                            "share" => SameKey::Share,
                            "serialize" => SameKey::Serialize,
                            _ => {
                                return line.err(format!(
                                    "invalid same-key `{v}`: expected share or serialize"
                                ))
                            }
                        }
                    }
                    "release" => {
                        config.release = match v {
                            "shutdown" => ReleasePolicy::Shutdown,
                            "suspend" => ReleasePolicy::Suspend,
                            _ => match (v.strip_prefix("keep-warm:"), v.strip_prefix("tiers:")) {
                                (Some(d), _) => ReleasePolicy::KeepWarm {
                                    idle: duration(&line, d)?,
                                },
                                (_, Some(t)) => ReleasePolicy::Tiered(tiers(&line, t)?),
                                _ => {
                                    return line.err(format!(
                                        "invalid release `{v}`: expected shutdown, keep-warm:<duration>, suspend or tiers:<idle>:<shutdown|suspend>[:<retain>]"
                                    ))
                                }
                            },
                        }
                    }
                    "drain" => config.drain_deadline = duration(&line, v)?,
                    "start-timeout" => config.start_timeout = duration(&line, v)?,
                    "upload-timeout" => config.upload_timeout = duration(&line, v)?,
                    "wait-timeout" => config.wait_timeout = duration(&line, v)?,
                    "max-waiters" => config.max_waiters = number(&line, k, v)? as usize,
                    "close-deadline" => close_deadline = duration(&line, v)?,
                    "command-timeout" => config.command_timeout = duration(&line, v)?,
                    "close-grace" => config.close_grace = duration(&line, v)?,
                    "upload-retries" => {
                        config.upload_retries = u32::try_from(number(&line, k, v)?)
                            .or_else(|_| line.err("upload-retries is too large"))?
                    }
                    "retry-backoff" => config.retry_backoff = duration(&line, v)?,
                    "hook-after-start" => config.hooks.after_start = Some(duration(&line, v)?),
                    "hook-after-resume" => config.hooks.after_resume = Some(duration(&line, v)?),
                    "hook-before-suspend" => {
                        config.hooks.before_suspend = Some(duration(&line, v)?)
                    }
                    "hook-before-stop" => config.hooks.before_stop = Some(duration(&line, v)?),
                    "hook-suspend-failure" => {
                        config.hooks.on_suspend_failure = match v {
                            "suspend" => SuspendHookFailure::Suspend,
                            "shutdown" => SuspendHookFailure::Shutdown,
                            _ => {
                                return line.err(format!(
                                    "invalid hook-suspend-failure `{v}`: expected suspend or shutdown"
                                ))
                            }
                        }
                    }
                    _ => unreachable!("keys() admits only the listed keys"),
                }
            }
            if let Err(e) = config.validate() {
                return line.err(format!("invalid configuration: {e}"));
            }
            continue;
        }
        let step = match &fleet {
            Some(spec) => super::fleet::fleet_wide(&mut line, verb, spec)?,
            None => parse_step(&mut line, verb)?,
        };
        steps.push((no, step));
    }
    Ok(Scenario {
        config,
        close_deadline,
        steps,
        fleet,
    })
}

/// An application step whose names fit the grammar but that the core refuses: the call it
/// acquires (for `acquire`) and why. Names are checked lexically first (a line that does not
/// fit the grammar is malformed, not refused).
fn refused_name(line: &Line, verb: &str) -> Result<Option<(Option<String>, String)>, ParseError> {
    use sandkeeper::InvalidName;
    type Check = fn(&str) -> Result<(), InvalidName>;
    let call: Check = |t| CallId::new(t).map(drop);
    let session: Check = |t| SessionId::new(t).map(drop);
    let user: Check = |t| UserId::new(t).map(drop);
    let external: Check = |t| ExternalId::new(t).map(drop);
    let path: Check = |t| PathName::new(t).map(drop);
    let (first, keyed): ((&str, Check), &[(&str, Check)]) = match verb {
        "acquire" => (
            ("call", call),
            &[("session", session), ("user", user), ("external", external)],
        ),
        "release" => (("call", call), &[]),
        "flush" => (("session", session), &[("path", path)]),
        "resolve" | "hold" | "unhold" | "enter" | "leave" => (("session", session), &[]),
        _ => return Ok(None),
    };
    let mut checks: Vec<(&str, &str, Check)> = Vec::new();
    if let Some(w) = line.words.get(1).filter(|w| !w.contains('=')) {
        checks.push((first.0, w, first.1));
    }
    for w in line.words.iter().skip(1) {
        if let Some((k, v)) = w.split_once('=') {
            if let Some((what, check)) = keyed.iter().find(|(key, _)| *key == k) {
                checks.push((what, v, *check));
            }
        }
    }
    for (what, text, check) in checks {
        check_name(line, what, text)?;
        if let Err(e) = check(text) {
            let acquired = (verb == "acquire")
                .then(|| line.words.get(1).map(|w| w.to_string()))
                .flatten();
            return Ok(Some((acquired, format!("{}: {}", e.what, e.why))));
        }
    }
    Ok(None)
}

pub(super) fn parse_step(line: &mut Line, verb: &str) -> Result<Step, ParseError> {
    if let Some((call, why)) = refused_name(line, verb)? {
        return Ok(Step::Refused {
            text: line.words.join(" "),
            call,
            why,
        });
    }
    let step = match verb {
        "acquire" => {
            let call = call_name(line, line.clone_word("a call name")?)?;
            line.pos += 1;
            let keys = line.keys(&["session", "user", "external"])?;
            let Some(s) = get(&keys, "session") else {
                return line.err("acquire needs session=<session>");
            };
            Step::Acquire {
                call,
                session: session_name(line, s)?,
                user: get(&keys, "user").map(|u| user_name(line, u)).transpose()?,
                external: get(&keys, "external")
                    .map(|e| external_name(line, e))
                    .transpose()?,
            }
        }
        "release" => {
            let c = line.positional("a call name")?;
            let call = call_name(line, c)?;
            let keys = line.keys(&["as"])?;
            match get(&keys, "as") {
                None => Step::Release(call),
                Some("suspend") => Step::ReleaseAs(call, WayDown::Suspend),
                Some("shutdown") => Step::ReleaseAs(call, WayDown::Shutdown),
                Some(other) => {
                    return line.err(format!(
                        "as={other}: a release asks `suspend` or `shutdown`"
                    ))
                }
            }
        }
        "flush" => {
            let s = line.positional("a session name")?;
            let session = session_name(line, s)?;
            let keys = line.keys(&["path", "bytes"])?;
            Step::Flush {
                session,
                path: get(&keys, "path").map(|p| path_name(line, p)).transpose()?,
                bytes: match get(&keys, "bytes") {
                    Some(b) => number(line, "bytes", b)? as usize,
                    None => 16,
                },
            }
        }
        "resolve" => {
            let s = line.positional("a session name")?;
            let session = session_name(line, s)?;
            let keys = line.keys(&["expect"])?;
            let expect = match get(&keys, "expect") {
                Some("none") => ResolveExpect::None,
                Some("gone") => ResolveExpect::Gone,
                Some(v) if v.starts_with('@') => ResolveExpect::Call(at_call(line, v)?),
                Some(v) => {
                    return line.err(format!(
                        "invalid expect=`{v}`: expected @<call>, none or gone"
                    ))
                }
                None => return line.err("resolve needs expect=@<call>, expect=none or expect=gone"),
            };
            Step::Resolve(session, expect)
        }
        "drop-snapshot" => {
            let k = line.positional("a key")?;
            line.done()?;
            Step::DropSnapshot(key_name(line, k)?)
        }
        "hold" | "unhold" | "enter" | "leave" => {
            let s = line.positional("a session name")?;
            line.done()?;
            let session = session_name(line, s)?;
            match verb {
                "hold" => Step::Hold(session),
                "unhold" => Step::Unhold(session),
                "enter" => Step::Enter(session),
                _ => Step::Leave(session),
            }
        }
        "close" => {
            let keys = line.keys(&["deadline"])?;
            Step::Close(
                get(&keys, "deadline")
                    .map(|d| duration(line, d))
                    .transpose()?,
            )
        }
        "advance" => {
            let d = line.positional("a duration (250ms, 5s)")?;
            line.done()?;
            Step::Advance(duration(line, d)?)
        }
        "start-ok" | "start-fail" | "upload-ok" | "stop-fail" | "persist-ok" | "persist-fail"
        | "shutdown-ok" | "shutdown-fail" | "hook-ok" | "hook-fail" | "die" | "instance-gone" => {
            let c = line.positional("@<call>")?;
            line.done()?;
            let answer = match verb {
                "start-ok" => Answer::StartOk,
                "start-fail" => Answer::StartFail,
                "upload-ok" => Answer::UploadOk,
                "stop-fail" => Answer::StopFail,
                "persist-ok" => Answer::PersistOk,
                "persist-fail" => Answer::PersistFail,
                "shutdown-ok" => Answer::ShutdownOk,
                "shutdown-fail" => Answer::ShutdownFail,
                "hook-ok" => Answer::HookOk,
                "hook-fail" => Answer::HookFail,
                "instance-gone" => Answer::InstanceGone,
                _ => Answer::Die,
            };
            Step::Answer(answer, at_call(line, c)?)
        }
        "upload-fail" => {
            let c = line.positional("@<call>")?;
            let call = at_call(line, c)?;
            let gone = match line.optional_positional() {
                None => false,
                Some("gone") => true,
                Some(w) => return line.err(format!("unexpected word `{w}`; expected `gone` or nothing")),
            };
            line.done()?;
            Step::Answer(Answer::UploadFail { gone }, call)
        }
        "stop-ok" => {
            let c = line.positional("@<call>")?;
            let call = at_call(line, c)?;
            let keys = line.keys(&["snapshot"])?;
            let snapshot = match get(&keys, "snapshot") {
                Some(s) => {
                    check_name(line, "snapshot", s)?;
                    Some(Snapshot::new(s))
                }
                None => None,
            };
            Step::Answer(Answer::StopOk { snapshot }, call)
        }
        "settle" => {
            let only = match line.optional_positional() {
                None => None,
                Some(c) => Some(at_call(line, c)?),
            };
            line.done()?;
            Step::Settle(only)
        }
        "expect" => Step::Expect(parse_expect(line)?),
        "config" => unreachable!("handled by the caller"),
        other => {
            return line.err(format!(
                "unknown step `{other}`; expected config, acquire, release, flush, resolve, hold, unhold, close, advance, \
                 start-ok, start-fail, upload-ok, upload-fail, stop-ok, stop-fail, persist-ok, persist-fail, shutdown-ok, \
                 shutdown-fail, hook-ok, hook-fail, die, instance-gone, settle or expect"
            ))
        }
    };
    Ok(step)
}

impl<'a> Line<'a> {
    fn clone_word(&self, what: &str) -> Result<&'a str, ParseError> {
        match self.words.get(self.pos) {
            Some(w) if !w.contains('=') => Ok(w),
            Some(w) => self.err(format!("expected {what}, found `{w}`")),
            None => self.err(format!("expected {what}")),
        }
    }
}

pub(super) fn parse_expect(line: &mut Line) -> Result<Expect, ParseError> {
    let what = line.positional(
        "what to expect: ready, waiting, failed, uploaded, dropped, running, state, stop, no-stop, shutdown, no-shutdown, resumed, discarded, no-discard, closed or error",
    )?;
    let e = match what {
        "ready" | "waiting" => {
            let c = line.positional("a call name")?;
            line.done()?;
            let c = call_name(line, c)?;
            if what == "ready" {
                Expect::Ready(c)
            } else {
                Expect::Waiting(c)
            }
        }
        "failed" => {
            let c = line.positional("a call name")?;
            check_name(line, "call", c)?;
            let c = c.to_string();
            let keys = line.keys(&["error"])?;
            let k = get(&keys, "error").map(|k| kind(line, k)).transpose()?;
            Expect::Failed(c, k)
        }
        "uploaded" => {
            let s = line.positional("a session name")?;
            let session = session_name(line, s)?;
            let keys = line.keys(&["path", "version", "into"])?;
            let Some(v) = get(&keys, "version") else {
                return line.err("expect uploaded needs version=<n>");
            };
            let Some(into) = get(&keys, "into") else {
                return line.err("expect uploaded needs into=@<call>");
            };
            Expect::Uploaded {
                session,
                path: get(&keys, "path").map(|p| path_name(line, p)).transpose()?,
                version: number(line, "version", v)?,
                into: at_call(line, into)?,
            }
        }
        "dropped" => {
            let s = line.positional("a session name")?;
            let session = session_name(line, s)?;
            let keys = line.keys(&["path", "version", "reason"])?;
            let Some(v) = get(&keys, "version") else {
                return line.err("expect dropped needs version=<n>");
            };
            Expect::Dropped {
                session,
                path: get(&keys, "path").map(|p| path_name(line, p)).transpose()?,
                version: number(line, "version", v)?,
                reason: get(&keys, "reason").map(|r| kind(line, r)).transpose()?,
            }
        }
        "running" | "stop" | "no-stop" | "shutdown" | "no-shutdown" => {
            let c = line.positional("@<call>")?;
            line.done()?;
            let c = at_call(line, c)?;
            match what {
                "running" => Expect::Running(c),
                "stop" => Expect::Stop(c),
                "no-stop" => Expect::NoStop(c),
                "shutdown" => Expect::Shutdown(c),
                _ => Expect::NoShutdown(c),
            }
        }
        "state" => {
            let c = line.positional("@<call>")?;
            let c = at_call(line, c)?;
            let w = line.positional("a sandbox state")?;
            line.done()?;
            let Some(state) = crate::step::STATES
                .iter()
                .copied()
                .find(|s| crate::step::state_word(*s) == w)
            else {
                return line.err(format!(
                    "unknown state `{w}`; expected starting, running, idle, draining, stopping, persisting, shutting-down or dead"
                ));
            };
            Expect::State(c, state)
        }
        "resumed" => {
            let c = line.positional("@<call>")?;
            let c = at_call(line, c)?;
            let keys = line.keys(&["from"])?;
            let Some(from) = get(&keys, "from") else {
                return line.err("expect resumed needs from=<snapshot>");
            };
            check_name(line, "snapshot", from)?;
            Expect::Resumed(c, from.to_string())
        }
        "discarded" | "no-discard" => {
            let s = line.positional("<snapshot>")?;
            line.done()?;
            check_name(line, "snapshot", s)?;
            if what == "discarded" {
                Expect::Discarded(s.to_string())
            } else {
                Expect::NoDiscard(s.to_string())
            }
        }
        "closed" => {
            line.done()?;
            Expect::Closed
        }
        "error" => {
            let k = line.positional("an error kind")?;
            line.done()?;
            Expect::Error(kind(line, k)?)
        }
        other => {
            return line.err(format!(
                "unknown expectation `{other}`; expected ready, waiting, failed, uploaded, dropped, running, state, stop, no-stop, shutdown, no-shutdown, resumed, discarded, no-discard, closed or error"
            ))
        }
    };
    Ok(e)
}

/// The tiers of `release=tiers:<idle>:<shutdown|suspend>[:<retain>]` (the part after
/// `tiers:`).
fn tiers(line: &Line<'_>, spec: &str) -> Result<Tiers, ParseError> {
    let mut parts = spec.split(':');
    let (Some(idle), Some(then)) = (parts.next(), parts.next()) else {
        return line.err(format!(
            "invalid tiers `{spec}`: expected <idle>:<shutdown|suspend>[:<retain>]"
        ));
    };
    let then = match then {
        "shutdown" => WayDown::Shutdown,
        "suspend" => WayDown::Suspend,
        other => {
            return line.err(format!(
                "invalid way down `{other}` in tiers: expected shutdown or suspend"
            ))
        }
    };
    let retain = parts.next().map(|r| duration(line, r)).transpose()?;
    if let Some(extra) = parts.next() {
        return line.err(format!("unexpected `{extra}` after the retention in tiers"));
    }
    Ok(Tiers {
        idle: duration(line, idle)?,
        then,
        retain,
    })
}

/// The `config` line spelling a configuration (with the extension keys).
pub fn config_line(config: &Config, close_deadline: Duration) -> String {
    let scope = match config.scope {
        Scope::Call => "call",
        Scope::Session => "session",
        Scope::User => "user",
        Scope::Agent => "agent",
        Scope::Global => "global",
    };
    let same_key = match config.same_key {
        SameKey::Share => "share",
        SameKey::Serialize => "serialize",
    };
    let release = match config.release {
        ReleasePolicy::Shutdown => "shutdown".to_string(),
        ReleasePolicy::KeepWarm { idle } => format!("keep-warm:{}", fmt_duration(idle)),
        ReleasePolicy::Suspend => "suspend".to_string(),
        ReleasePolicy::Tiered(t) => {
            let then = match t.then {
                WayDown::Shutdown => "shutdown",
                WayDown::Suspend => "suspend",
            };
            match t.retain {
                Some(r) => format!("tiers:{}:{then}:{}", fmt_duration(t.idle), fmt_duration(r)),
                None => format!("tiers:{}:{then}", fmt_duration(t.idle)),
            }
        }
    };
    let h = &config.hooks;
    let mut hooks = String::new();
    for (key, timeout) in [
        ("hook-after-start", h.after_start),
        ("hook-after-resume", h.after_resume),
        ("hook-before-suspend", h.before_suspend),
        ("hook-before-stop", h.before_stop),
    ] {
        if let Some(t) = timeout {
            hooks.push_str(&format!(" {key}={}", fmt_duration(t)));
        }
    }
    if h.on_suspend_failure == SuspendHookFailure::Shutdown {
        hooks.push_str(" hook-suspend-failure=shutdown");
    }
    format!(
        "config scope={scope} same-key={same_key} release={release} drain={} start-timeout={} upload-timeout={} \
         wait-timeout={} max-waiters={} close-deadline={} command-timeout={} close-grace={} upload-retries={} retry-backoff={}{hooks}",
        fmt_duration(config.drain_deadline),
        fmt_duration(config.start_timeout),
        fmt_duration(config.upload_timeout),
        fmt_duration(config.wait_timeout),
        config.max_waiters,
        fmt_duration(close_deadline),
        fmt_duration(config.command_timeout),
        fmt_duration(config.close_grace),
        config.upload_retries,
        fmt_duration(config.retry_backoff),
    )
}
