//! A test aid: a throwaway PostgreSQL cluster in a temporary directory, for the crate's tests
//! and its figures example, never for production. It finds the server's binaries
//! (`/usr/lib/postgresql/<version>/bin`, the newest; or the directory `SANDKEEPER_PG_BIN`
//! names), makes a cluster with `initdb`, and starts it with `pg_ctl`, listening only on a unix
//! socket in the directory (no TCP port, so clusters of tests running at once never collide).
//! The server refuses to run as root: when this process is root, the cluster's directory is
//! given to the system user `sandkeeper-ci` (made with `useradd` if missing) and every server
//! command runs as that user through `setpriv`. Dropping it stops the server (`pg_ctl stop -m
//! immediate`) and removes the directory.
//!
//! Missing binaries are an error that says to install PostgreSQL (the Debian `postgresql`
//! package): a test that needs the server fails rather than passing without it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// The unprivileged user a root test process runs the server as.
pub const SERVER_USER: &str = "sandkeeper-ci";

/// The database role the cluster is made with (trusted on its socket).
pub const ROLE: &str = "sandkeeper";

/// Why a throwaway cluster could not be made or driven.
#[derive(Debug, thiserror::Error)]
pub enum ThrowawayError {
    /// No PostgreSQL server binaries were found.
    #[error(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) under {searched}: install the \
         Debian `postgresql` package (apt-get install postgresql), or set SANDKEEPER_PG_BIN to \
         their directory"
    )]
    NoBinaries {
        /// Where they were looked for.
        searched: String,
    },
    /// A command could not be run, or failed.
    #[error("throwaway PostgreSQL: `{command}` failed: {why}")]
    Command {
        /// The command.
        command: String,
        /// Its error, or its status and output.
        why: String,
    },
    /// A query of the cluster failed.
    #[error("throwaway PostgreSQL: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// Server processes whose sessions were ended had not exited after ten seconds.
    #[error("throwaway PostgreSQL: server processes {0:?} still there ten seconds after their sessions ended")]
    StillRunning(Vec<i32>),
    /// The temporary directory could not be made or prepared.
    #[error("throwaway PostgreSQL: {0}")]
    Io(#[from] std::io::Error),
}

/// A running throwaway cluster. See the module docs.
#[derive(Debug)]
pub struct Throwaway {
    bin: PathBuf,
    dir: PathBuf,
    as_user: bool,
    /// The loopback TCP port it also serves TLS on ([`start_tls`](Self::start_tls)).
    tls_port: Option<u16>,
}

impl Throwaway {
    /// Makes a cluster in a new temporary directory and starts its server (waiting until it
    /// accepts connections: `pg_ctl -w`).
    ///
    /// The server runs with `fsync=off` (a test's cluster is thrown away: durability would
    /// only slow the tests down); [`start_durable`](Self::start_durable) keeps it on.
    pub fn start() -> Result<Throwaway, ThrowawayError> {
        Throwaway::start_with(false, None)
    }

    /// As [`start`](Self::start), the server also listening on a free loopback TCP port with
    /// TLS on (`ssl=on`), presenting the certificate `cert_pem` (for the name `localhost`) with
    /// the key `key_pem`: [`tls_config`](Self::tls_config) reaches it there.
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Result<Throwaway, ThrowawayError> {
        Throwaway::start_with(false, Some((cert_pem, key_pem)))
    }

    /// As [`start`](Self::start), with `fsync` on: every commit waits for its WAL flush, as on
    /// a server that keeps what it confirmed (for figures that include the commit's cost).
    pub fn start_durable() -> Result<Throwaway, ThrowawayError> {
        Throwaway::start_with(true, None)
    }

    fn start_with(fsync: bool, tls: Option<(&str, &str)>) -> Result<Throwaway, ThrowawayError> {
        let bin = find_binaries()?;
        let dir = fresh_dir()?;
        // Root runs the server as SERVER_USER; the directory must be that user's.
        let as_user = is_root()?;
        let tls_port = tls.map(|_| free_port()).transpose()?;
        let cluster = Throwaway {
            bin,
            dir,
            as_user,
            tls_port,
        };
        if as_user {
            ensure_server_user()?;
            run(Command::new("chown").arg(SERVER_USER).arg(&cluster.dir))?;
        }
        std::fs::create_dir_all(cluster.socket_dir())?;
        if as_user {
            run(Command::new("chown")
                .arg(SERVER_USER)
                .arg(cluster.socket_dir()))?;
        }
        cluster.server_command("initdb", |c| {
            c.arg("-D").arg(cluster.data_dir()).args([
                "-U",
                ROLE,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]);
        })?;
        let listen = match (tls, tls_port) {
            (Some((cert, key)), Some(port)) => cluster.tls_files(cert, key, port)?,
            _ => "-c listen_addresses=''".to_string(),
        };
        cluster.server_command("pg_ctl", |c| {
            c.arg("-D")
                .arg(cluster.data_dir())
                .arg("-l")
                .arg(cluster.dir.join("server.log"))
                .arg("-o")
                .arg(format!(
                    "-k {} {listen} -c fsync={} -c max_connections=200",
                    cluster.socket_dir().display(),
                    if fsync { "on" } else { "off" }
                ))
                .args(["-w", "-t", "60", "start"]);
        })?;
        Ok(cluster)
    }

    /// The connection settings of the cluster's database `postgres`, as its role, over its
    /// socket.
    pub fn config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(self.socket_dir())
            .user(ROLE)
            .dbname("postgres");
        if let Some(port) = self.tls_port {
            // The socket's name carries the server's port.
            config.port(port);
        }
        config
    }

    /// The server's certificate and key written into the cluster's directory (the key readable
    /// by the server's user alone, as the server demands), and the options that serve TLS on
    /// the loopback `port`.
    fn tls_files(&self, cert: &str, key: &str, port: u16) -> Result<String, ThrowawayError> {
        use std::os::unix::fs::PermissionsExt;
        let (cert_file, key_file) = (self.dir.join("server.crt"), self.dir.join("server.key"));
        std::fs::write(&cert_file, cert)?;
        std::fs::write(&key_file, key)?;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
        if self.as_user {
            run(Command::new("chown")
                .arg(SERVER_USER)
                .arg(&cert_file)
                .arg(&key_file))?;
        }
        Ok(format!(
            "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c listen_addresses=127.0.0.1 -p {port}",
            cert_file.display(),
            key_file.display()
        ))
    }

    /// The connection settings of the cluster's TCP port with TLS required (`sslmode=require`,
    /// host `localhost`), for a cluster made by [`start_tls`](Self::start_tls); `None` otherwise.
    pub fn tls_config(&self) -> Option<tokio_postgres::Config> {
        let port = self.tls_port?;
        let mut config = tokio_postgres::Config::new();
        config
            .host("localhost")
            .port(port)
            .user(ROLE)
            .dbname("postgres")
            .ssl_mode(tokio_postgres::config::SslMode::Require);
        Some(config)
    }

    /// [`config`](Self::config) as a key=value connection string (`host=<socket dir>
    /// user=… dbname=postgres`), for a process given `--store` on its command line.
    pub fn connection_string(&self) -> String {
        let port = self
            .tls_port
            .map_or(String::new(), |p| format!(" port={p}"));
        format!(
            "host={} user={ROLE} dbname=postgres{port}",
            self.socket_dir().display()
        )
    }

    /// Restarts the server (`pg_ctl restart -m fast`: every connection is ended), waiting until
    /// it accepts connections again.
    pub fn restart(&self) -> Result<(), ThrowawayError> {
        self.server_command("pg_ctl", |c| {
            // The log again: without it the new server writes to pg_ctl's output, which it
            // then holds open, and reading that output to its end would never end.
            c.arg("-D")
                .arg(self.data_dir())
                .arg("-l")
                .arg(self.dir.join("server.log"))
                .args(["-m", "fast", "-w", "-t", "60", "restart"]);
        })
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.join("socket")
    }

    /// Runs the server binary `name` (as [`SERVER_USER`] when this process is root), its
    /// arguments set by `args`.
    fn server_command(
        &self,
        name: &str,
        args: impl FnOnce(&mut Command),
    ) -> Result<(), ThrowawayError> {
        let program = self.bin.join(name);
        let mut command = if self.as_user {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={SERVER_USER}"),
                &format!("--regid={SERVER_USER}"),
                "--init-groups",
            ])
            .arg(&program);
            c
        } else {
            Command::new(&program)
        };
        command.current_dir(&self.dir).env("LC_ALL", "C");
        args(&mut command);
        run(&mut command).map(|_| ())
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        // A cluster whose start failed has no server to stop.
        if !self.data_dir().join("postmaster.pid").exists() {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        let stopped = self.server_command("pg_ctl", |c| {
            c.arg("-D")
                .arg(self.data_dir())
                .args(["-m", "immediate", "-w", "stop"]);
        });
        if let Err(e) = stopped {
            eprintln!("throwaway PostgreSQL at {}: {e}", self.dir.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory of the server binaries: `SANDKEEPER_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin` holding `initdb`, `pg_ctl` and `postgres`.
fn find_binaries() -> Result<PathBuf, ThrowawayError> {
    let complete = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    if let Some(dir) = std::env::var_os("SANDKEEPER_PG_BIN").map(PathBuf::from) {
        return if complete(&dir) {
            Ok(dir)
        } else {
            Err(ThrowawayError::NoBinaries {
                searched: dir.display().to_string(),
            })
        };
    }
    let base = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            complete(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| ThrowawayError::NoBinaries {
            searched: "/usr/lib/postgresql/*/bin".into(),
        })
}

/// A new, empty directory under the system's temporary directory, readable by the server's
/// user (the path leads to the socket, whose length the kernel bounds: kept short).
fn fresh_dir() -> Result<PathBuf, ThrowawayError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "skpg-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A free loopback TCP port (bound, then released for the server to take).
fn free_port() -> Result<u16, ThrowawayError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn is_root() -> Result<bool, ThrowawayError> {
    let out = run(Command::new("id").arg("-u"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Makes the system user [`SERVER_USER`] if it does not exist.
fn ensure_server_user() -> Result<(), ThrowawayError> {
    // One test process's threads make it one at a time: a second `useradd` racing the first
    // leaves a moment where the name resolves and the uid does not (initdb then fails).
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let exists = Command::new("id")
        .arg(SERVER_USER)
        .output()
        .map_err(|e| ThrowawayError::Command {
            command: format!("id {SERVER_USER}"),
            why: e.to_string(),
        })?
        .status
        .success();
    if !exists {
        // Two test processes may race to make it: the loser's failure is fine if the user is
        // there afterwards.
        let made = run(Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            SERVER_USER,
        ]));
        if made.is_err() && !Command::new("id").arg(SERVER_USER).status()?.success() {
            made?;
        }
    }
    Ok(())
}

/// Runs `command` to its end: its output, or an error with its status and output.
fn run(command: &mut Command) -> Result<Output, ThrowawayError> {
    let shown = format!("{command:?}");
    let out = command.output().map_err(|e| ThrowawayError::Command {
        command: shown.clone(),
        why: e.to_string(),
    })?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(ThrowawayError::Command {
            command: shown,
            why: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

/// Rows inserted, updated or deleted in the store's tables (schema `sandkeeper_fleet`) over the
/// server's life, as its cumulative statistics (`pg_stat_user_tables`) hold them: a session's
/// counts reach them when it exits. So the caller ends the sessions whose writes it counts
/// (drops their stores) and names their server processes in `ended`; this waits until those are
/// gone from `pg_stat_activity` (real processes exiting: polled every 10 ms, at most 10 s),
/// then reads. Counting on the server needs no extension (`pg_stat_statements`) and sees every
/// row a function wrote, not statements.
pub async fn rows_written(
    admin: &tokio_postgres::Client,
    ended: &[i32],
) -> Result<i64, ThrowawayError> {
    let ended = ended.to_vec();
    let mut attempts = 0;
    loop {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
                &[&ended],
            )
            .await?;
        if row.get::<_, i64>(0) == 0 {
            break;
        }
        attempts += 1;
        if attempts == 1_000 {
            return Err(ThrowawayError::StillRunning(ended));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    admin
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    let row = admin
        .query_one(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint \
             FROM pg_stat_user_tables WHERE schemaname = 'sandkeeper_fleet'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}
