//! Child processes of the tests: `aubier serve` (or any command) with its stderr lines on a
//! channel, stopped by its PID, killed when dropped so that a failing test leaves nothing running.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A fresh scratch directory for the test `test`, named `name` (this process' id in the name).
pub fn scratch_dir(test: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aubier-{test}-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// What `aubier serve`'s listening line says before its address.
const LISTENING: &str = "listening on http://";

/// A running child whose stderr lines arrive on a channel.
pub struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `cmd` with its stderr piped to the line channel.
    pub fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    /// `aubier serve ARGS` in `cwd` with `env` added and `AUBIER_MODEL` removed, stdout
    /// discarded.
    pub fn serve(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_aubier"));
        cmd.arg("serve")
            .args(args)
            .current_dir(cwd)
            .env_remove("AUBIER_MODEL")
            .stdout(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc::spawn(cmd)
    }

    /// Waits for the "listening on http://ADDR" line and returns ADDR.
    pub fn address(&self) -> std::net::SocketAddr {
        Self::listening_address(&self.listening_line())
    }

    /// Waits (up to 60 s, else panics) for the "listening on http://ADDR ..." line and returns
    /// it whole.
    pub fn listening_line(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("a listening line on stderr");
            if line.contains(LISTENING) {
                return line;
            }
        }
    }

    /// The ADDR of a "listening on http://ADDR ..." line; panics on another line.
    pub fn listening_address(line: &str) -> std::net::SocketAddr {
        let rest = line.split(LISTENING).nth(1).expect("a listening line");
        let addr = rest.split_whitespace().next().expect("address");
        addr.parse().expect("socket address")
    }

    /// The stderr lines received so far.
    pub fn lines_so_far(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Whether the child has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Sends `sig` to the child's PID.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill failed");
    }

    /// Waits up to `limit` for the child to exit (killing it and panicking past that); returns
    /// its exit code and the stderr lines not read yet.
    pub fn wait(&mut self, limit: Duration) -> (Option<i32>, Vec<String>) {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                std::thread::sleep(Duration::from_millis(50));
                let rest: Vec<String> = self.lines.try_iter().collect();
                return (status.code(), rest);
            }
            if t0.elapsed() > limit {
                let _ = self.child.kill();
                panic!("{:?} did not exit within {limit:?}", self.child.id());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
