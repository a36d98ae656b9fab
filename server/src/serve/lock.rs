//! The exclusive lock file `aubier serve` takes at boot, so that no benchmark (or second server)
//! runs beside it on the same machine and skews its numbers.
//!
//! Algorithm: open (create) the file, then try an exclusive advisory lock (`flock(2)` through
//! `std::fs::File::try_lock`) every 25 ms until it is taken or `wait` has passed. The holder writes
//! its pid into the file so that a refused process can say who holds it. The lock is released
//! when the [`LockFile`] is dropped (and by the kernel if the process dies), so a crashed server
//! never leaves a stale lock behind; the file itself stays.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The exit status of `aubier serve` when the lock cannot be taken: `EX_UNAVAILABLE` (sysexits.h).
pub const EXIT_LOCKED: u8 = 69;

/// Where the lock lives unless `--lock-file` says otherwise: `$TMPDIR/aubier.lock`. Anything that
/// must not run beside a server (benchmarks) takes the same file.
pub fn default_lock_path() -> PathBuf {
    std::env::temp_dir().join("aubier.lock")
}

/// Errors of [`LockFile::acquire`].
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The file could not be opened or written.
    #[error("lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another process held the lock for the whole wait.
    #[error("lock file {path} is held by {holder} (waited {waited_ms} ms, --lock-wait-ms)")]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// "pid N" as the holder wrote it, or "another process".
        holder: String,
        /// How long we waited, in ms.
        waited_ms: u128,
    },
}

/// An exclusive lock on a file, held until drop.
#[derive(Debug)]
pub struct LockFile {
    file: File,
    path: PathBuf,
}

impl LockFile {
    /// Takes the exclusive lock on `path` (created if missing), retrying for up to `wait`.
    ///
    /// Errors: [`LockError::Busy`] when another process holds it after `wait`; [`LockError::Io`]
    /// when the file cannot be opened or written.
    pub fn acquire(path: &Path, wait: Duration) -> Result<LockFile, LockError> {
        let io = |source| LockError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let t0 = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) => {
                    if t0.elapsed() >= wait {
                        let mut text = String::new();
                        let holder = match file.read_to_string(&mut text) {
                            Ok(_) if !text.trim().is_empty() => format!("pid {}", text.trim()),
                            _ => "another process".to_owned(),
                        };
                        return Err(LockError::Busy {
                            path: path.to_owned(),
                            holder,
                            waited_ms: t0.elapsed().as_millis(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(LockFile {
            file,
            path: path.to_owned(),
        })
    }

    /// The locked file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock too; unlocking first makes the release explicit
        // and immediate even if a descriptor was inherited.
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_waits_then_fails_and_succeeds_after_release() {
        let dir = std::env::temp_dir().join(format!("aubier-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.lock");
        let first = LockFile::acquire(&path, Duration::ZERO).unwrap();
        let t0 = Instant::now();
        let err = LockFile::acquire(&path, Duration::from_millis(100)).unwrap_err();
        assert!(t0.elapsed() >= Duration::from_millis(100));
        match err {
            LockError::Busy { holder, .. } => {
                assert_eq!(holder, format!("pid {}", std::process::id()))
            }
            other => panic!("unexpected {other}"),
        }
        drop(first);
        LockFile::acquire(&path, Duration::ZERO).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
