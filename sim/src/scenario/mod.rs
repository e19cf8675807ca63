//! Scenario files (`.scn`): one interleaving written by hand, run against the real core with
//! every invariant checked after every step, then the `expect` lines and liveness.
//!
//! The format is a public interface, documented in `docs/scenarios.md` and implemented here:
//! one step per line, `#` comments, `config` keys before the first step, application steps,
//! backend steps (`@call` names the sandbox a call is or was bound to), `settle`, and `expect`
//! lines. Malformed lines are [`ParseError`]s naming the line and what was expected.
//!
//! Extensions (optional `config` keys, so every file of the base format still parses the same):
//! `command-timeout=<d>`, `close-grace=<d>`, `upload-retries=<n>`, `retry-backoff=<d>` set the
//! core's remaining deadlines, so that a shrunk simulator run can spell its whole configuration.
//!
//! A name outside `[A-Za-z0-9_.-]+` is a parse error. A name that fits the grammar but that the
//! core's name types refuse (`.`, `..`, too long) is, in an application step, an input the core
//! rejects (`Step::Refused`: an `acquire` fails its call with `invalid-name`, any other step
//! sets the last error); elsewhere (a backend step's `@call`, an expectation) it is a parse
//! error.
//!
//! Fleet scenarios (`fleet.rs`): a `fleet replicas=<n> ...` line before the first step makes
//! the file a fleet's, run by the fleet world (`crate::fleet::script`); a step that happens on
//! one replica is written after the replica's name in brackets, `[r1] acquire a session=s1`.
//! Brackets are no part of any one-process line (a name is `[A-Za-z0-9_.-]+`, a sandbox is
//! `@<call>`), so a file without a `fleet` line parses exactly as before.

mod exec;
mod fleet;
mod parse;

pub use exec::{run_scenario, run_steps, RunMode, Verdict};
pub use fleet::{fleet_line_text, DEFAULT_TIMING};
pub use parse::{config_line, parse, ParseError, Scenario, KINDS};
