//! Lifecycle hooks: commands the operator names (`--hooks FILE`), run inside a sandbox at the
//! keeper's transitions, each bounded by its timeout.
//!
//! The keeper orders a hook at its place ([`HookPoint`]): after a fresh start and after a
//! resume (before the create's or the resume's call is ready: a failure fails the create or
//! the resume, which answers 503 and changes nothing), and after the drain of a pause or a
//! kill (before the sandbox stops: a failure is counted and the way down goes on). The file is
//! JSON, every point optional:
//!
//! ```json
//! {"after_start":    {"argv": ["sh", "-c", "git clone --depth 1 $REPO src"], "timeout_secs": 60},
//!  "after_resume":   {"argv": ["sh", "-c", "./refresh-credentials"], "timeout_secs": 10},
//!  "before_suspend": {"argv": ["sh", "-c", "git -C src stash"], "timeout_secs": 30},
//!  "before_stop":    {"argv": ["sh", "-c", "./upload-artifacts"], "timeout_secs": 30}}
//! ```
//!
//! A hook runs as the sandbox's commands do (its isolation, its workspace as the working
//! directory, no variables of the host); exit code 0 is success, anything else (another code,
//! a signal, its timeout) a failure, whose standard error's last bytes say why.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sandkeeper::{HookPoint, Hooks};
use sandkeeper_tokio::ops::ExecOptions;
use sandkeeper_tokio::SandboxWork;
use serde::Deserialize;

use crate::backend::SandboxBackend;
use crate::metrics::Metrics;

/// The longest a hook may be given.
pub const MAX_HOOK_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most bytes of a hook file.
const MAX_FILE: u64 = 64 * 1024;

/// The most bytes of a hook's standard error quoted in its failure.
const QUOTED: usize = 512;

/// One hook: a command and how long it may run.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HookCommand {
    /// The command, argv (never a shell string; name a shell to have one).
    pub argv: Vec<String>,
    /// How long it may run, 1 to 3600 seconds: past it, the hook failed.
    pub timeout_secs: u64,
}

/// The hooks of every point, as the file names them.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HookFile {
    /// After a fresh start (a create), before the sandbox is handed out.
    pub after_start: Option<HookCommand>,
    /// After a resume, before the sandbox is handed out.
    pub after_resume: Option<HookCommand>,
    /// After the drain of a pause, before the sandbox stops.
    pub before_suspend: Option<HookCommand>,
    /// After the drain of a kill, before the sandbox stops.
    pub before_stop: Option<HookCommand>,
}

impl HookFile {
    /// Reads and checks `path`. Errors say what was wrong, naming the file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("--hooks {shown}: {e}"))?;
        if meta.len() > MAX_FILE {
            return Err(format!("--hooks {shown}: over {MAX_FILE} bytes"));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("--hooks {shown}: {e}"))?;
        let file: HookFile =
            serde_json::from_str(&text).map_err(|e| format!("--hooks {shown}: {e}"))?;
        file.check().map_err(|e| format!("--hooks {shown}: {e}"))?;
        Ok(file)
    }

    fn check(&self) -> Result<(), String> {
        for (point, hook) in self.each() {
            let name = point.as_str();
            if hook.argv.is_empty() || hook.argv[0].is_empty() {
                return Err(format!("{name}: argv names no program"));
            }
            if hook.argv.iter().any(|a| a.contains('\0')) {
                return Err(format!("{name}: argv holds a NUL byte"));
            }
            let timeout = Duration::from_secs(hook.timeout_secs);
            if timeout.is_zero() || timeout > MAX_HOOK_TIMEOUT {
                return Err(format!("{name}: timeout_secs must be 1 to 3600"));
            }
        }
        Ok(())
    }

    /// The points that have a hook, with it.
    fn each(&self) -> impl Iterator<Item = (HookPoint, &HookCommand)> {
        [
            (HookPoint::AfterStart, &self.after_start),
            (HookPoint::AfterResume, &self.after_resume),
            (HookPoint::BeforeSuspend, &self.before_suspend),
            (HookPoint::BeforeStop, &self.before_stop),
        ]
        .into_iter()
        .filter_map(|(point, hook)| hook.as_ref().map(|h| (point, h)))
    }

    /// The hook of `point`, if any.
    fn at(&self, point: HookPoint) -> Option<&HookCommand> {
        self.each().find(|(p, _)| *p == point).map(|(_, h)| h)
    }

    /// The keeper's hook configuration: a timeout for each point that has a hook.
    pub fn core_hooks(&self) -> Hooks {
        let timeout = |point| {
            self.at(point)
                .map(|h: &HookCommand| Duration::from_secs(h.timeout_secs))
        };
        Hooks {
            after_start: timeout(HookPoint::AfterStart),
            after_resume: timeout(HookPoint::AfterResume),
            before_suspend: timeout(HookPoint::BeforeSuspend),
            before_stop: timeout(HookPoint::BeforeStop),
            ..Hooks::default()
        }
    }
}

/// The keeper's hook runner over `file`: runs the point's command in the sandbox and counts
/// its outcome.
pub fn runner(
    file: Arc<HookFile>,
    metrics: Arc<Metrics>,
) -> impl Fn(HookPoint, SandboxWork<'static, SandboxBackend>) -> HookFuture + Send + Sync + 'static
{
    move |point, work| {
        let file = file.clone();
        let metrics = metrics.clone();
        Box::pin(async move {
            let Some(hook) = file.at(point) else {
                // The keeper orders only the points the configuration names.
                return Ok(());
            };
            let ran = run(hook, &work).await;
            let outcome = if ran.is_ok() { "ok" } else { "failed" };
            metrics.count_hook(&metrics.hooks, point, outcome);
            match &ran {
                Ok(()) => {
                    tracing::info!(sandbox = %work.sandbox(), hook = point.as_str(), "hook ok")
                }
                Err(why) => {
                    tracing::warn!(sandbox = %work.sandbox(), hook = point.as_str(), %why, "hook failed");
                }
            }
            ran
        })
    }
}

/// A hook's run, as the keeper awaits it.
pub type HookFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

async fn run(
    hook: &HookCommand,
    work: &SandboxWork<'static, SandboxBackend>,
) -> Result<(), String> {
    let options = ExecOptions {
        timeout: Some(Duration::from_secs(hook.timeout_secs)),
        output_cap: 4096,
        ..ExecOptions::default()
    };
    let out = work
        .exec(hook.argv.clone(), options)
        .await
        .map_err(|e| e.to_string())?;
    if out.success() {
        return Ok(());
    }
    let tail = &out.stderr[out.stderr.len().saturating_sub(QUOTED)..];
    let why = match out.code {
        Some(code) => format!("exit code {code}"),
        None => "ended by a signal".to_string(),
    };
    Err(format!(
        "{why}: {}",
        String::from_utf8_lossy(tail).trim_end()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HookFile, String> {
        let file: HookFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        file.check()?;
        Ok(file)
    }

    #[test]
    fn a_file_names_the_points_it_hooks_and_their_timeouts() {
        let file = parse(
            r#"{"after_resume": {"argv": ["true"], "timeout_secs": 5},
                "before_stop": {"argv": ["sh", "-c", "exit 0"], "timeout_secs": 7}}"#,
        )
        .unwrap();
        let hooks = file.core_hooks();
        assert_eq!(hooks.after_start, None);
        assert_eq!(hooks.after_resume, Some(Duration::from_secs(5)));
        assert_eq!(hooks.before_suspend, None);
        assert_eq!(hooks.before_stop, Some(Duration::from_secs(7)));
    }

    #[test]
    fn a_bad_file_says_what_is_wrong() {
        for (text, says) in [
            (
                r#"{"after_start": {"argv": [], "timeout_secs": 5}}"#,
                "names no program",
            ),
            (
                r#"{"after_start": {"argv": ["x"], "timeout_secs": 0}}"#,
                "1 to 3600",
            ),
            (
                r#"{"after_start": {"argv": ["x"], "timeout_secs": 3601}}"#,
                "1 to 3600",
            ),
            (
                r#"{"before_pause": {"argv": ["x"], "timeout_secs": 1}}"#,
                "unknown field",
            ),
            (r#"{"after_start": {"argv": ["x"]}}"#, "timeout_secs"),
            (
                r#"{"after_start": {"argv": ["a\u0000b"], "timeout_secs": 1}}"#,
                "NUL",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
