//! Records the git commit the `aubier` binary is built from as `AUBIER_COMMIT` (the full hash of
//! `HEAD`, or empty when the source is not a git checkout or git is not installed), for the
//! receipts of `--receipt` (`src/receipt.rs`). It reruns when `HEAD`, the branch it names or the
//! packed refs change, so a new commit is seen by the next build; a build from a tree with
//! uncommitted changes records the commit it started from.

use std::path::Path;
use std::process::Command;

/// The trimmed stdout of `git ARGS` run in `dir`, or `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|s| !s.is_empty())
}

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    let dir = Path::new(&dir);
    let commit = git(dir, &["rev-parse", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=AUBIER_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(dir, &["rev-parse", "--symbolic-full-name", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", &name]) {
            let path = dir.join(path);
            // A path that does not exist would make cargo rerun this script on every build.
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}
