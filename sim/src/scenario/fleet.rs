//! Parsing the lines of a fleet scenario: the `fleet` line, a step on one replica
//! (`[rN] <step>`), and the lines that belong to the whole fleet (time, settling, the store's
//! expectations). A file without a `fleet` line never comes here, so it keeps its meaning.

use std::time::Duration;

use sandkeeper::{Config, FenceReason, Fleet, Key, SessionId, UserId};

use super::parse::{
    at_call, call_name, check_name, duration, get, number, parse_expect, parse_step, Line,
    ParseError,
};
use crate::step::fleet::{
    fmt_ppm, BackendAnswer, FleetExpect, FleetSpec, FleetStep, Link, ReplicaNo, ShelfFault,
    StoreAnswer,
};
use crate::step::{fmt_duration, Step};

/// The lease timing of a `fleet` line that gives none: the simulator's fleet world's.
pub const DEFAULT_TIMING: Fleet = Fleet {
    incarnation: 1,
    lease: Duration::from_secs(10),
    renew_every: Duration::from_secs(3),
    margin: Duration::from_secs(2),
    claim_retry: Duration::from_millis(500),
    handover: sandkeeper::Handover::Warm,
};

/// Application steps, as in one process, that happen on one replica.
const APPLICATION: [&str; 9] = [
    "acquire", "release", "flush", "resolve", "hold", "unhold", "enter", "leave", "close",
];

/// Backend answers, as in one process (plus `fenced`), that reach one replica.
const BACKEND: [&str; 15] = [
    "start-ok",
    "start-fail",
    "upload-ok",
    "upload-fail",
    "stop-ok",
    "stop-fail",
    "persist-ok",
    "persist-fail",
    "shutdown-ok",
    "shutdown-fail",
    "hook-ok",
    "hook-fail",
    "die",
    "instance-gone",
    "fenced",
];

/// What happens to one replica itself.
const REPLICA: [&str; 5] = ["store", "pause", "crash", "restart", "sweep"];

/// The commands carrying a token, which the backend may refuse.
const FENCEABLE: [&str; 7] = [
    "start", "adopt", "upload", "stop", "persist", "shutdown", "hook",
];

/// A duration to the nanosecond, for a fleet's `advance`: an integer with `ns`, `us`, `ms` or
/// `s` (a seed's transcript reaches each instant exactly).
fn fine_duration(line: &Line, text: &str) -> Result<Duration, ParseError> {
    let (digits, nanos) = if let Some(d) = text.strip_suffix("ns") {
        (d, 1)
    } else if let Some(d) = text.strip_suffix("us") {
        (d, 1_000)
    } else {
        return duration(line, text);
    };
    let n = (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse::<u64>().ok())
        .flatten()
        .and_then(|n| n.checked_mul(nanos));
    match n {
        Some(n) => Ok(Duration::from_nanos(n)),
        None => line.err(format!(
            "invalid duration `{text}`: expected an integer with ns, us, ms or s"
        )),
    }
}

/// `fleet replicas=<n> [lease=<d>] [renew-every=<d>] [margin=<d>] [claim-retry=<d>]
/// [drift=<ppm>,...] [store=auto|down|hold]`: sets `config.fleet` (the timing) and answers the
/// rest.
pub(super) fn fleet_line(line: &mut Line, config: &mut Config) -> Result<FleetSpec, ParseError> {
    let keys = line.keys(&[
        "replicas",
        "lease",
        "renew-every",
        "margin",
        "claim-retry",
        "drift",
        "store",
        "calm-after",
        "events",
        "backend-fencing",
        "conservation",
        "hosts",
    ])?;
    let Some(n) = get(&keys, "replicas") else {
        return line.err("fleet needs replicas=<n> (at least 1)");
    };
    let replicas = number(line, "replicas", n)? as usize;
    if replicas == 0 || replicas > 64 {
        return line.err(format!("replicas={replicas}: expected 1 to 64 replicas"));
    }
    let mut timing = DEFAULT_TIMING;
    for (k, v) in &keys {
        match *k {
            "lease" => timing.lease = duration(line, v)?,
            "renew-every" => timing.renew_every = duration(line, v)?,
            "margin" => timing.margin = duration(line, v)?,
            "claim-retry" => timing.claim_retry = duration(line, v)?,
            _ => {}
        }
    }
    let drift_ppm = match get(&keys, "drift") {
        None => vec![0; replicas],
        Some(list) => {
            let drift = list
                .split(',')
                .map(|d| ppm(line, d))
                .collect::<Result<Vec<i64>, ParseError>>()?;
            if drift.len() != replicas {
                return line.err(format!(
                    "drift={list} gives {} clocks for {replicas} replicas: expected one signed ppm per replica, comma-separated",
                    drift.len()
                ));
            }
            drift
        }
    };
    let link = match get(&keys, "store") {
        None => Link::Auto,
        Some(v) => link(line, v)?,
    };
    let on_advance = match get(&keys, "events") {
        None | Some("before-steps") => false,
        Some("on-advance") => true,
        Some(other) => {
            return line.err(format!(
                "invalid events `{other}`: expected before-steps or on-advance"
            ))
        }
    };
    let backend_fencing = match get(&keys, "backend-fencing") {
        None | Some("on") => true,
        Some("off") => false,
        Some(other) => {
            return line.err(format!(
                "invalid backend-fencing `{other}`: expected on or off"
            ))
        }
    };
    let conservation = match get(&keys, "conservation") {
        None | Some("on") => true,
        Some("off") => false,
        Some(other) => {
            return line.err(format!(
                "invalid conservation `{other}`: expected on or off"
            ))
        }
    };
    let hosts = match get(&keys, "hosts") {
        None | Some("off") => false,
        Some("on") => true,
        Some(other) => return line.err(format!("invalid hosts `{other}`: expected on or off")),
    };
    let calm_after = get(&keys, "calm-after")
        .map(|d| duration(line, d))
        .transpose()?;
    if hosts {
        // Keys go between hosts suspended, as the local backend with a shelf requires.
        timing.handover = sandkeeper::Handover::Suspended;
    }
    config.fleet = Some(timing);
    if let Err(e) = config.validate() {
        return line.err(format!("invalid fleet timing: {e}"));
    }
    Ok(FleetSpec {
        replicas,
        drift_ppm,
        link,
        calm_after,
        on_advance,
        backend_fencing,
        conservation,
        hosts,
    })
}

/// The `fleet` line spelling a fleet (its timing from `timing`).
pub fn fleet_line_text(spec: &FleetSpec, timing: &Fleet) -> String {
    let mut text = format!(
        "fleet replicas={} lease={} renew-every={} margin={} claim-retry={}",
        spec.replicas,
        fmt_duration(timing.lease),
        fmt_duration(timing.renew_every),
        fmt_duration(timing.margin),
        fmt_duration(timing.claim_retry)
    );
    if spec.drift_ppm.iter().any(|d| *d != 0) {
        let drift: Vec<String> = spec.drift_ppm.iter().map(|d| fmt_ppm(*d)).collect();
        text.push_str(&format!(" drift={}", drift.join(",")));
    }
    if spec.link != Link::Auto {
        text.push_str(&format!(" store={}", spec.link));
    }
    if let Some(d) = spec.calm_after {
        text.push_str(&format!(" calm-after={}", fmt_duration(d)));
    }
    if spec.on_advance {
        text.push_str(" events=on-advance");
    }
    if !spec.backend_fencing {
        text.push_str(" backend-fencing=off");
    }
    if !spec.conservation {
        text.push_str(" conservation=off");
    }
    if spec.hosts {
        text.push_str(" hosts=on");
    }
    text
}

fn ppm(line: &Line, text: &str) -> Result<i64, ParseError> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    let value = (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse::<i64>().ok())
        .flatten();
    match value {
        Some(v) if v.abs() < 1_000_000 => Ok(v),
        _ => line.err(format!(
            "invalid drift `{text}`: expected a signed whole number of parts per million, between -999999 and +999999 (+20000: 2% fast)"
        )),
    }
}

fn link(line: &Line, text: &str) -> Result<Link, ParseError> {
    match text {
        "auto" => Ok(Link::Auto),
        "down" => Ok(Link::Down),
        "hold" => Ok(Link::Hold),
        other => line.err(format!(
            "invalid store link `{other}`: expected auto, down or hold"
        )),
    }
}

/// A fleet key as scenarios write it, as the core prints keys: `session:<name>`,
/// `user:<name>`, `agent` or `global`.
fn key(line: &Line, text: &str) -> Result<Key, ParseError> {
    let named = |what: &str, name: &str| check_name(line, what, name);
    match text.split_once(':') {
        None if text == "agent" => Ok(Key::Agent),
        None if text == "global" => Ok(Key::Global),
        Some(("session", name)) => {
            named("session", name)?;
            SessionId::new(name)
                .map(Key::Session)
                .or_else(|e| line.err(format!("invalid session name: {}", e.why)))
        }
        Some(("user", name)) => {
            named("user", name)?;
            UserId::new(name)
                .map(Key::User)
                .or_else(|e| line.err(format!("invalid user name: {}", e.why)))
        }
        Some(("call" | "external", _)) => line.err(format!(
            "`{text}` is never a fleet key (a call's or an external sandbox's key is the process's own): expected session:<name>, user:<name>, agent or global"
        )),
        _ => line.err(format!(
            "invalid key `{text}`: expected session:<name>, user:<name>, agent or global"
        )),
    }
}

/// The replica a `[rN]` word names, one of the fleet's.
fn replica(line: &Line, word: &str, spec: &FleetSpec) -> Result<ReplicaNo, ParseError> {
    let number = word
        .strip_prefix("[r")
        .and_then(|w| w.strip_suffix(']'))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<usize>().ok());
    match number {
        Some(n) if n < spec.replicas => Ok(ReplicaNo(n)),
        Some(n) => line.err(format!(
            "unknown replica r{n}: the fleet has {} (r0 to r{})",
            spec.replicas,
            spec.replicas - 1
        )),
        None => line.err(format!(
            "invalid replica `{word}`: expected [r<n>] (e.g. [r0]) followed by a step"
        )),
    }
}

/// `[rN] <step>`: a step on one replica.
pub(super) fn on_replica(line: &Line, spec: &FleetSpec) -> Result<Step, ParseError> {
    let r = replica(line, line.words[0], spec)?;
    let Some(verb) = line.words.get(1).copied() else {
        return line.err(format!("expected a step after `{}`", line.words[0]));
    };
    // The rest of the line, read as a line of its own (the verb first).
    let mut rest = Line {
        no: line.no,
        words: line.words[1..].to_vec(),
        pos: 1,
    };
    let step = if APPLICATION.contains(&verb) || verb == "settle" {
        parse_step(&mut rest, verb)?
    } else if BACKEND.contains(&verb) {
        Step::Fleet(backend(&mut rest, verb)?)
    } else if let Some(answer) = StoreAnswer::ALL.into_iter().find(|a| a.verb() == verb) {
        Step::Fleet(store(&mut rest, answer)?)
    } else if REPLICA.contains(&verb) {
        Step::Fleet(own(&mut rest, verb)?)
    } else if verb == "expect" {
        expect_on(&mut rest)?
    } else if verb == "advance" {
        return rest.err("advance moves the whole fleet's time: write it without a replica");
    } else if matches!(verb, "config" | "fleet") {
        return rest.err(format!(
            "`{verb}` is the whole fleet's, before the first step: write it without a replica"
        ));
    } else {
        return rest.err(format!(
            "unknown step `{verb}` on {r}; expected an application step ({}), a backend answer ({}), a store answer ({}), {}, settle or expect",
            APPLICATION.join(", "),
            BACKEND.join(", "),
            StoreAnswer::ALL.map(StoreAnswer::verb).join(", "),
            REPLICA.join(", ")
        ));
    };
    Ok(Step::On(r, Box::new(step)))
}

/// A line of a fleet scenario without a replica: the fleet's time, settling, and what the
/// store holds.
pub(super) fn fleet_wide(
    line: &mut Line,
    verb: &str,
    spec: &FleetSpec,
) -> Result<Step, ParseError> {
    match verb {
        "advance" => {
            let d = line.positional("a duration (250ms, 5s; in a fleet also 1500us, 1500000ns)")?;
            let by = fine_duration(line, d)?;
            let keys = line.keys(&["at-target"])?;
            Ok(match get(&keys, "at-target") {
                None => Step::Advance(by),
                Some(k) => Step::Fleet(FleetStep::Advance {
                    by,
                    at_target: number(line, "at-target", k)? as usize,
                }),
            })
        }
        "settle" => parse_step(line, verb),
        "expect" => {
            let what = line.words.get(1).copied().unwrap_or("");
            if matches!(what, "owner" | "record") {
                let e = expect_store(line, spec)?;
                Ok(Step::Fleet(FleetStep::Expect(e)))
            } else {
                line.err(format!(
                    "`expect {what}` is about one replica: write it after the replica, `[r0] expect {what} ...` (only `expect owner` and `expect record`, about the store, stand alone)"
                ))
            }
        }
        v if APPLICATION.contains(&v)
            || BACKEND.contains(&v)
            || REPLICA.contains(&v)
            || StoreAnswer::ALL.iter().any(|a| a.verb() == v)
            || matches!(v, "instance-gone") =>
        {
            line.err(format!(
                "in a fleet, `{v}` happens on one replica: write it after the replica, `[r0] {v} ...`"
            ))
        }
        other => line.err(format!(
            "unknown step `{other}`; in a fleet, a line is config, fleet, advance, settle, expect owner, expect record, or a step after its replica ([r0] ...)"
        )),
    }
}

/// Takes the `<key>=<value>` word off the line, wherever it is: its value.
fn take_key<'a>(line: &mut Line<'a>, key: &str) -> Result<Option<&'a str>, ParseError> {
    let prefix = format!("{key}=");
    let Some(i) = line.words.iter().position(|w| w.starts_with(&prefix)) else {
        return Ok(None);
    };
    let word = line.words.remove(i);
    if line.words.iter().any(|w| w.starts_with(&prefix)) {
        return line.err(format!("key `{key}` given twice"));
    }
    Ok(Some(&word[prefix.len()..]))
}

/// The delivery delay and the run (`after=<d>`, `run=<k>`) of an answer, taken off the line.
fn take_after_run(line: &mut Line) -> Result<(Option<Duration>, Option<usize>), ParseError> {
    let after = take_key(line, "after")?
        .map(|d| duration(line, d))
        .transpose()?;
    let run = take_key(line, "run")?
        .map(|k| number(line, "run", k).map(|k| k as usize))
        .transpose()?;
    Ok((after, run))
}

fn backend(line: &mut Line, verb: &str) -> Result<FleetStep, ParseError> {
    let (after, run) = take_after_run(line)?;
    let shelf = match take_key(line, "shelf")? {
        None => None,
        Some("fail") => Some(ShelfFault::Fail),
        Some("late") => Some(ShelfFault::Late),
        Some(other) => return line.err(format!("invalid shelf `{other}`: expected fail or late")),
    };
    if verb == "fenced" {
        let c = line.positional("@<call>")?;
        let call = at_call(line, c)?;
        let command = match line.optional_positional() {
            None => None,
            Some(w) if FENCEABLE.contains(&w) => Some(w.to_string()),
            Some(w) => {
                return line.err(format!(
                    "unexpected word `{w}`; expected the refused command ({}) or nothing",
                    FENCEABLE.join(", ")
                ))
            }
        };
        line.done()?;
        return Ok(FleetStep::Backend {
            answer: BackendAnswer::Fenced(command),
            call,
            run,
            after,
            shelf,
        });
    }
    match parse_step(line, verb)? {
        Step::Answer(answer, call) => Ok(FleetStep::Backend {
            answer: BackendAnswer::Plain(answer),
            call,
            run,
            after,
            shelf,
        }),
        other => unreachable!("a backend verb parses to an answer, not {other:?}"),
    }
}

fn store(line: &mut Line, answer: StoreAnswer) -> Result<FleetStep, ParseError> {
    let (after, run) = take_after_run(line)?;
    let key = if answer.is_renewal() {
        None
    } else {
        let k = line.positional("a key (session:<name>, user:<name>, agent or global)")?;
        Some(key(line, k)?)
    };
    let keys = line.keys(&["id"])?;
    let id = get(&keys, "id")
        .map(|n| number(line, "id", n))
        .transpose()?;
    Ok(FleetStep::Store {
        answer,
        key,
        id,
        run,
        after,
    })
}

fn own(line: &mut Line, verb: &str) -> Result<FleetStep, ParseError> {
    let step = match verb {
        "store" => {
            let l = line.positional("auto, down or hold")?;
            FleetStep::Link(link(line, l)?)
        }
        "pause" => {
            let d = line.positional("a duration (250ms, 5s)")?;
            FleetStep::Pause(duration(line, d)?)
        }
        "crash" => FleetStep::Crash,
        "restart" => {
            let keys = line.keys(&["drift"])?;
            FleetStep::Restart {
                drift_ppm: get(&keys, "drift").map(|d| ppm(line, d)).transpose()?,
            }
        }
        _ => FleetStep::Sweep,
    };
    line.done()?;
    Ok(step)
}

/// `[rN] expect ...`: ownership on the replica, or any one-process expectation.
fn expect_on(line: &mut Line) -> Result<Step, ParseError> {
    let what = line.words.get(1).copied().unwrap_or("");
    let e = match what {
        "lost" => {
            line.pos += 1;
            let c = line.positional("a call name")?;
            FleetExpect::Lost(call_name(line, c)?)
        }
        "claim" => {
            line.pos += 1;
            let k = line.positional("a key")?;
            FleetExpect::Claim(key(line, k)?)
        }
        "token" => {
            line.pos += 1;
            let k = line.positional("a key")?;
            let k = key(line, k)?;
            let n = line.positional("a token number or none")?;
            let token = match n {
                "none" => None,
                n => Some(number(line, "token", n)?),
            };
            FleetExpect::Token(k, token)
        }
        "adopt" | "relinquish" => {
            line.pos += 1;
            let c = line.positional("@<call>")?;
            let c = at_call(line, c)?;
            if what == "adopt" {
                FleetExpect::Adopt(c)
            } else {
                FleetExpect::Relinquish(c)
            }
        }
        "fenced" => {
            line.pos += 1;
            let k = line.positional("a key")?;
            let k = key(line, k)?;
            let keys = line.keys(&["reason"])?;
            let reason = match get(&keys, "reason") {
                None => None,
                Some("lapse") => Some(FenceReason::LeaseLapsed),
                Some("refused") => Some(FenceReason::Refused),
                Some(other) => {
                    return line.err(format!(
                        "invalid reason `{other}`: expected lapse or refused"
                    ))
                }
            };
            FleetExpect::Fenced(k, reason)
        }
        "owner" | "record" => {
            return line.err(format!(
                "`expect {what}` is about the store, not one replica: write it without the replica"
            ))
        }
        _ => return Ok(Step::Expect(parse_expect(line)?)),
    };
    line.done()?;
    Ok(Step::Fleet(FleetStep::Expect(e)))
}

/// `expect owner <key> <rN>|none [token=<n>]` or `expect record <key> [warm=@<call>|none]
/// [snapshot=<name>|none]`.
fn expect_store(line: &mut Line, spec: &FleetSpec) -> Result<FleetExpect, ParseError> {
    line.pos = 2;
    let what = line.words[1];
    let k = line.positional("a key")?;
    let k = key(line, k)?;
    if what == "owner" {
        let who = line.positional("a replica (r0, r1, ...) or none")?;
        let owner = match who {
            "none" => None,
            w => {
                let n = w
                    .strip_prefix('r')
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|n| n.parse::<usize>().ok());
                match n {
                    Some(n) if n < spec.replicas => Some(ReplicaNo(n)),
                    Some(n) => {
                        return line.err(format!(
                            "unknown replica r{n}: the fleet has {} (r0 to r{})",
                            spec.replicas,
                            spec.replicas - 1
                        ))
                    }
                    None => {
                        return line.err(format!(
                            "invalid owner `{w}`: expected a replica (r0, r1, ...) or none"
                        ))
                    }
                }
            }
        };
        let keys = line.keys(&["token"])?;
        let token = get(&keys, "token")
            .map(|t| number(line, "token", t))
            .transpose()?;
        return Ok(FleetExpect::Owner(k, owner, token));
    }
    let keys = line.keys(&["warm", "snapshot"])?;
    let warm = match get(&keys, "warm") {
        None => None,
        Some("none") => Some(None),
        Some(c) => Some(Some(at_call(line, c)?)),
    };
    let snapshot = match get(&keys, "snapshot") {
        None => None,
        Some("none") => Some(None),
        Some(s) => {
            check_name(line, "snapshot", s)?;
            Some(Some(s.to_string()))
        }
    };
    Ok(FleetExpect::Record {
        key: k,
        warm,
        snapshot,
    })
}
